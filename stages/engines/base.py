"""What every generation engine is: the `Engine` protocol, its sampling settings
and its completions (the registry of engines: `stages.engines`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch. ``temperature == 0`` is greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()  # stop strings (the end-of-turn token always stops)
    seed: int = 0


@dataclass
class Completion:
    """One response. `finished`: it ended with the end-of-turn token or a stop string
    (False: cut at `max_new_tokens`). `forced`: not sampled but chosen by the rollout's
    exploration (`stages.agent.explore`); `logprobs` are then the policy's log-probs
    of its tokens, scored by the engine."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    text: str = field(default="", repr=False)
    forced: bool = False


class Engine(Protocol):
    """What the rollout needs from a generation engine."""

    tokenizer: Any  # the checkpoint's Hugging Face tokenizer

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt (prompts are token ids, unpadded)."""
        ...

    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float) -> list[list[float]]:
        """The log-probabilities of each response's tokens after its prompt, under
        log_softmax(logits / temperature) (0 counts as 1), as `generate` stores them
        (used by `rollout.explore`; the `hf` engine has it, `vllm` not yet, and the
        rollout's spec check says so)."""
        ...

    def load_weights(self, policy_dir: Path) -> bool:
        """Load a new policy checkpoint of the same architecture and tokenizer,
        keeping the engine; False when the engine could not and rebuilt itself."""
        ...

    def load_state(self, state: dict[str, Any], source: str = "the weights given") -> None:
        """Load a policy's tensors by name, from the trainer's memory
        (`stages.training.resident`; the `hf` engine only: vLLM is given checkpoints)."""
        ...
