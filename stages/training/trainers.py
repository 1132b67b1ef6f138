"""The two kinds of resident trainer (`stages.training.resident`): the policy and its
optimiser in this process (`Trainer`, ``optim.workers: 0``), or on a worker group kept
for the run (`GroupTrainer`, `stages.training.group`). Both hold one policy version
(`Held`) and answer the same calls: apply an update, save the checkpoint, hand over the
weights, digest them."""

from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from catalog.datasets import ArtifactRef
from stages.training.fit import OPTIMIZER_FILE
from stages.training.loops import ActorJob, ActorSettings, KLReference


@dataclass
class Held:
    """What a resident trainer holds, whatever runs it: which policy version, and a
    stored policy of the same architecture and tokenizer (engines build from it)."""

    address: str  # the policy result it holds (``<key>/policy``)
    base: ArtifactRef
    version: int
    parent: str  # the key of the update that made it ("" for a stored policy)

    def moved(self, key: str) -> None:
        """The trainer now holds the next version, `key`'s result."""
        self.address, self.version, self.parent = f"{key}/policy", self.version + 1, key


class Trainer:
    """The policy in this process with its optimiser (``workers: 0``)."""

    def __init__(self, held: Held, model: Any, tokenizer: Any, opt: Any, use_gpu: bool) -> None:
        self.held, self.model, self.tokenizer, self.opt = held, model, tokenizer, opt
        self.shape = (0, use_gpu)
        self.reference = KLReference()

    @staticmethod
    def load(ref: ArtifactRef, cfg: ActorSettings) -> Trainer:
        """The stored policy `ref` and its optimiser state."""
        from stages.models.policy import load_policy
        from stages.training.fit import optimizer

        path = ref.local_path()
        model, tokenizer = load_policy(path, device=_device(cfg), dtype="float32")
        opt = optimizer(model, cfg.optim, path)
        return Trainer(_held(ref), model, tokenizer, opt, cfg.optim.use_gpu)

    def apply(
        self, cfg: ActorSettings, table: Any, reference: ArtifactRef, seed: int, key: str, ctx: Any
    ) -> dict[str, float]:
        """One update on `table` (per-sample rows, not empty), as the result `key`."""
        import torch

        from stages.training import signals
        from stages.training.loops import actor_steps, continued

        self.opt, table = continued(self.model, self.opt, cfg, table)
        ref_logp = self.reference.logprobs(cfg, reference, _device(cfg))
        job = ActorJob(key=key, seed=seed, cfg=cfg, policy=self.held.base, reference=reference, rows=table.num_rows)
        dev = torch.device(_device(cfg))
        with tempfile.TemporaryDirectory(prefix="train-") as scratch:
            watch = signals.watch_progress(ctx, Path(scratch)) if ctx is not None else contextlib.nullcontext()
            with watch:
                return actor_steps(self.model, self.opt, ref_logp, table, cfg, replace(job, scratch=scratch), dev)

    def save(self, out: Path, keep_optimizer: bool) -> None:
        """The whole checkpoint (and the optimiser state) into `out`."""
        import torch

        from stages.models.policy import save_policy

        out.mkdir(parents=True, exist_ok=True)
        save_policy(self.model, self.tokenizer, out, version=self.held.version, parent=self.held.parent)
        if keep_optimizer:
            torch.save(self.opt.state_dict(), out / OPTIMIZER_FILE)

    def state(self) -> dict[str, Any]:
        from stages.models.policy import engine_state

        return engine_state(self.model)

    def digest(self) -> str:
        from stages.training.loops import weights_digest

        return weights_digest(self.model)

    def places(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        return None


class GroupTrainer:
    """The policy on a worker group kept for the run (``workers >= 1``, `stages.training.group`)."""

    def __init__(self, held: Held, group: Any) -> None:
        self.held, self.group = held, group
        self.shape = (group.workers, group.use_gpu)

    @staticmethod
    def load(ref: ArtifactRef, cfg: ActorSettings) -> GroupTrainer:
        from stages.training.group import Group

        _ray()
        group = Group(cfg.optim.workers, cfg.optim.use_gpu, cfg.optim.gpus)
        try:
            group.load(ref, cfg.optim)
        except BaseException:
            group.close()
            raise
        return GroupTrainer(_held(ref), group)

    def apply(
        self, cfg: ActorSettings, table: Any, reference: ArtifactRef, seed: int, key: str, ctx: Any
    ) -> dict[str, float]:
        return self.group.apply(cfg, table, reference, seed, key)

    def save(self, out: Path, keep_optimizer: bool) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.group.files_to(out, self.held.version, self.held.parent, keep_optimizer)

    def state(self) -> dict[str, Any]:
        return self.group.state()

    def digest(self) -> str:
        return self.group.digest()

    def places(self) -> list[dict[str, Any]]:
        return self.group.places()

    def close(self) -> None:
        self.group.close()


Resident = Trainer | GroupTrainer


def _held(ref: ArtifactRef) -> Held:
    from stages.models.policy import policy_version

    path = ref.stored_path()
    meta = json.loads((path / "policy.json").read_text())
    return Held(ref.address, ref, policy_version(path), meta.get("parent", ""))


def _ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)


def _device(cfg: ActorSettings) -> str:
    return "cuda" if cfg.optim.use_gpu else "cpu"
