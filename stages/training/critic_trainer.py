"""The critic's trainer kept in this process between updates.

With ``critic.optim.workers: 0`` and a critic that is a whole model (``strategy: ddp``,
no LoRA adapter), `critic.update` trains the value model this process holds: the first
update loads the critic it starts from and its AdamW state, and every later one goes
on from what it holds, with no Ray Train fit started and nothing read back. Every
version is still stored whole with its optimiser state (the next `advantage` step reads
the critic from storage), so what is kept in memory only saves the load and the fit:
the stored result is byte for byte the one a Ray Train fit in local mode gives
(`stages.training.loops.critic_steps` is the body of both; tested). A version this
process does not hold (a resumed run, another node's step, a failed update) is loaded
from storage. The policy's trainer, which also keeps versions only in memory, is
`stages.training.resident`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from catalog.datasets import ArtifactRef
from common import live
from stages.training.fit import OPTIMIZER_FILE
from stages.training.loops import CriticJob, CriticSettings


@dataclass
class _Held:
    address: tuple[str, str]  # the critic result it holds: (its catalog, ``<key>/critic``)
    model: Any
    opt: Any
    info: dict[str, Any]  # that version's ``critic.json``


_LOCK = threading.Lock()


@dataclass
class _Slot:
    """The run's slot (`common.live`): the critic held between updates (at most one)."""

    held: list[_Held] = field(default_factory=list)

    def close(self) -> None:
        self.held.clear()


def _slot() -> list[_Held]:
    return live.slot("held critic", _Slot).held


def supports(cfg: CriticSettings, base: ArtifactRef | None) -> bool:
    """Whether an update with `cfg` trains the critic held in this process: no workers
    and a whole model (a LoRA critic, with its `base`, runs a Ray Train fit)."""
    return cfg.optim.workers == 0 and cfg.optim.strategy == "ddp" and base is None


def drop() -> None:
    """Forget the critic held (tests, and a process that starts another run)."""
    with _LOCK:
        _slot().clear()


def update(ctx: Any, cfg: CriticSettings, job: CriticJob, table: pa.Table, out: Path) -> dict[str, float]:
    """One critic update on `table` (per-sample rows, not empty) into `out` (the next
    version and its optimiser state); the metrics, as `stages.training.fit.fit` gives them."""
    import torch

    from common.placement import here
    from stages.models.critic import critic_info, load_critic
    from stages.training import fit as train
    from stages.training.loops import critic_steps, save_critic

    dev = torch.device("cuda" if cfg.optim.use_gpu and torch.cuda.is_available() else "cpu")
    with _LOCK:
        held = _slot().pop() if _slot() else None  # taken: an update that fails leaves nothing half-trained held
    catalog = job.critic.root.uri  # the catalog's address (not the object's: a new Root of it is the same)
    if held is None or held.address != (catalog, job.critic.address):
        path = job.critic.local_path()
        model = load_critic(path, dev, None, trainable=True)
        held = _Held((catalog, job.critic.address), model, train.optimizer(model, cfg.optim, path), critic_info(path))
    elif not cfg.optim.keep_optimizer:  # a fresh AdamW, as a load gives (no state is read without keep_optimizer)
        held.opt = train.optimizer(held.model, cfg.optim, Path())
    else:
        for group in held.opt.param_groups:  # the spec's settings, as a loaded optimiser gets them
            group.update(lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay)
    metrics = critic_steps(held.model, held.opt, table, cfg, replace(job, rows=table.num_rows), dev)
    out.mkdir(parents=True, exist_ok=True)
    info = save_critic(held.model, held.info, job.key, out)
    if cfg.optim.keep_optimizer:
        torch.save(held.opt.state_dict(), out / OPTIMIZER_FILE)
    if hasattr(ctx, "place"):
        ctx.place("worker", 0, here(), None)
    with _LOCK:
        _slot()[:] = [_Held((catalog, f"{job.key}/critic"), held.model, held.opt, info)]
    return metrics | {"perf/worker_restarts": 0.0}
