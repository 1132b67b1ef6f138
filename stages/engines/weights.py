"""A policy's weights as an engine is brought to them: a checkpoint, or tensors from the
run's trainer (`Weights`), and which engines take tensors (`from_memory`,
`engine_policy`). The engine hosts (`stages.engines.hosts`) load what these name."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog.datasets import ArtifactRef


@dataclass
class Weights:
    """A policy version's weights in memory (`stages.training.resident`): `name` tells it
    from every other version, `base` is a stored policy of the same architecture and
    tokenizer (what an engine is built from), `state` the tensors by name, or their
    Ray object reference once put into the object store (`on_ray`)."""

    name: str
    version: int
    base: ArtifactRef
    state: Any

    @property
    def key(self) -> str:
        return self.name.rsplit("/", 2)[-2]

    def on_ray(self) -> Weights:
        """The same weights with `state` in Ray's object store (put once, shared by the
        actors of a node)."""
        import ray

        if not isinstance(self.state, ray.ObjectRef):
            self.state = ray.put(self.state)
        return self

    def tensors(self) -> dict[str, Any]:
        import ray

        return ray.get(self.state) if isinstance(self.state, ray.ObjectRef) else self.state


#: what an engine is brought to: a committed checkpoint, a Path to one not yet committed
#: (the warm start's check episodes), or weights in memory
Policy = ArtifactRef | Path | Weights

#: where the weights of a policy version may be had from memory (the run's trainer:
#: `stages.training.resident` sets ``MEMORY["policy"]``): ``fn(ref, tensors)`` gives what an
#: engine that takes tensors (or not) is brought to, or None when that memory does not hold it
MEMORY: dict[str, Callable[[ArtifactRef, bool], Policy | None]] = {}


def from_memory(cfg: Any) -> tuple[str, ...]:
    """The `in_memory` inputs of a stage that plays on engines (`cfg.engine_settings()`):
    its policy where the engines load tensors (`EngineSettings.takes_tensors`); none for
    vLLM on CPU, which loads checkpoints (a version it plays is stored whole)."""
    return ("policy",) if cfg.engine_settings().takes_tensors else ()


def engine_policy(policy: ArtifactRef, tensors: bool) -> Policy:
    """What an engine is brought to for `policy`: where it takes `tensors`, its weights
    from memory when the run's trainer holds them (or rebuilds them, for a version kept
    only in memory); else the stored checkpoint."""
    for held in MEMORY.values():
        got = held(policy, tensors)
        if got is not None:
            return got
    return policy


def architecture(policy_dir: Path) -> str:
    """A digest of what an engine is built for: the model config and the tokenizer
    (checkpoints equal in these take each other's weights)."""
    digest = hashlib.sha256()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (policy_dir / f).exists():
            digest.update((policy_dir / f).read_bytes())
    return digest.hexdigest()
