"""Training on a batch with Ray Train: one loop, in-process or on N workers.

`fit` hands the batch to a Ray Train `TorchTrainer` as a Ray Data dataset. With
``workers: 0`` Ray Train runs the loop in this process (local mode: no worker
start-up, the CPU default); with N it runs the *same* loop on N workers, each
reading its shard. The loop reports its metrics and a checkpoint folder from rank
0, which `fit` copies into the stage's output.

The pieces every loop shares live here: the optimiser (AdamW, its state carried
from one policy version to the next in the checkpoint), the step (gradients
summed across workers by hand, clipped, applied) and the report; what a worker
does with its part of the batch (mini-batches, micro-batches, sums over the
workers) is `stages.training.worker`. Gradients are all-reduced by
hand rather than through DDP because the forward pass runs the decoder and the
output head separately (`stages.models.critic`), which DDP's wrapper would not see.
A sharded model (`stages.training.sharding`, ``strategy: fsdp``) is reduce-scattered by
FSDP2 instead; `step` only scales its gradients.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from catalog.datasets import ArtifactRef
from catalog.upkeep import OPTIMIZER_STATE
from common.config import ConfigProblem, param
from common.errors import UserError
from stages.lost_nodes import watched
from stages.training import signals
from stages.training.sharding import collective_device, load_optimizer_state, sharded, world

OPTIMIZER_FILE = OPTIMIZER_STATE  # what `pipeline gc --optimizer-states` looks for
#: how often Ray Train's controller looks at its workers (its default, 2 s, let a fit wait about
#: 4 s after its loop had ended: 5 s from the loop's start to `fit` returning, against 1 s at
#: 0.2 s, for a loop that reports at once); an environment that sets it keeps its own
POLL_SECONDS = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")


@dataclass(frozen=True)
class OptimConfig:
    """How one model is optimised on a batch (actor or critic)."""

    lr: float = param(1e-4, "learning rate, constant (paper: actor 1e-6, critic 1e-5 for a 0.5B model)", gt=0)
    weight_decay: float = param(0.01, "AdamW weight decay (reference: 0.01)", ge=0)
    betas: tuple[float, float] = param((0.9, 0.999), "AdamW betas (reference: 0.9, 0.999)")
    grad_clip: float = param(1.0, "clip the gradient's global norm to this (reference: 1.0)", gt=0)
    epochs: int = param(1, "passes over the batch (ppo_epochs)", ge=1)
    mini_batch_size: int = param(
        32,
        "samples per optimiser step, over all workers (ppo_mini_batch_size): "
        "trajectories, or turns with a history window (agent.history)",
        ge=1,
    )
    micro_batch_size: int = param(4, "samples per forward pass; gradients accumulate over a mini-batch", ge=1)
    keep_optimizer: bool = param(
        True,
        "save the optimiser state with the checkpoint and resume it at the "
        "next version (a fresh AdamW each iteration otherwise)",
    )
    workers: int = param(0, "Ray Train workers; 0: local mode, in this process", ge=0)
    use_gpu: bool = param(False, "train on GPUs: `gpus` of one per worker (in this process with workers 0)")
    gpus: float = param(
        1.0,
        "GPUs a worker holds with use_gpu; a fraction shares one GPU with the engine actors (actor_gpus), "
        "as one GPU runs both in starpo-qwen0.5b.yaml",
        gt=0,
        le=1,
    )
    precision: Literal["float32", "bf16-mixed"] = param(
        "float32",
        "bf16-mixed: forward and backward passes under bfloat16 autocast (and TF32 matmuls on a GPU), with "
        "float32 master weights and optimiser state; log-softmax, losses and temperatures stay float32",
    )
    gradient_checkpointing: bool = param(
        False,
        "recompute each layer's activations in the backward pass: activations of one layer held at a time, "
        "for about a third more compute (the same gradients)",
        key=False,
    )
    strategy: Literal["ddp", "fsdp"] = param(
        "ddp",
        "ddp: every worker holds the whole model and optimiser state, and gradients are summed; fsdp: "
        "parameters, gradients and optimiser state are sharded over the workers (FSDP2 fully_shard), "
        "for models one device cannot hold (needs workers >= 2)",
    )

    def __post_init__(self) -> None:
        if self.strategy == "fsdp" and self.workers < 2:
            raise ConfigProblem(
                "strategy", f"fsdp shards over Ray Train workers: set workers >= 2 (got {self.workers})"
            )


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """What a training loop gets besides its shard of the batch: the result key it
    trains for and its seed (set by the stage), the batch's rows and the scratch
    folder for its checkpoint (set by `fit`). Loops take a subclass with their inputs
    (`stages.training.loops.ActorJob`, `CriticJob`)."""

    key: str
    seed: int
    rows: int = 0
    scratch: str | None = None


@dataclass(frozen=True)
class LocalContext:
    """What `fit` uses of a `StageContext`, for a fit outside a run (benches, tests): a
    result key, a local catalog (checkpoints stay on this machine) and a Ray session
    started on first use (`num_cpus`: None for all of them)."""

    key: str
    num_cpus: int | None = None

    def shared_storage(self) -> None:
        return None

    def ray(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, num_cpus=self.num_cpus)


#: the key of rank 0's report that carries every rank's place (`common.placement.here`)
PLACES = "placement"

#: restarts of the Ray Train worker group after a worker dies, per fit (``workers >= 1``)
WORKER_RESTARTS = 2
#: the metric that counts them, declared by every stage that fits (`update`, `critic.update`)
RESTARTS_METRIC = {
    "perf/worker_restarts": "times Ray Train restarted the worker group after a worker died (killed, out of memory, "
    "its node lost); the update ran again from the same policy, batch and seed; also a row of the run's events. "
    "Absent where it cannot be known (a fit whose rank 0 ran on another machine)"
}


def _stop_controllers() -> None:
    """End this driver's Ray Train fits (nodes lost, `stages.lost_nodes.watched`): their
    controller actors are killed, and with them the worker group and its placement
    group; `TrainController` is how Ray Train 2 names them (it keeps no handle here)."""
    import ray
    import ray._private.state as state
    from ray._private.worker import global_worker

    job = ray.get_runtime_context().get_job_id()
    for actor_id, info in state.actors().items():
        if (
            info.get("ActorClassName") == "TrainController"
            and info.get("State") == "ALIVE"
            and info.get("JobID") == job
        ):
            core = global_worker.core_worker
            core.kill_actor(ray.ActorID(bytes.fromhex(actor_id)), True)  # what ray.kill does, by id


def fit(
    ctx: Any,
    loop: Callable[[dict[str, Any]], None],
    job: TrainJob,
    batch: pa.Table,
    optim: OptimConfig,
    out: Path,
) -> dict[str, float]:
    """Run `loop` under a Ray Train `TorchTrainer` on `batch` (its config is
    ``{"job": job}``, with the batch's rows and the scratch folder filled in); copy
    the checkpoint it reports into `out`; return its metrics."""
    import ray.data
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from stages.runtime import quiet

    ctx.ray()
    quiet()
    out.mkdir(parents=True, exist_ok=True)
    shared = ctx.shared_storage()  # workers on other machines write their checkpoint there
    # Ray Train's storage and the checkpoint written for it live beside the result
    # being staged (removed with it, whatever happens), not in the system temp folder
    with (
        tempfile.TemporaryDirectory(prefix=".train-", dir=out.parent) as local,
        tempfile.TemporaryDirectory(prefix=".ckpt-", dir=out.parent) as scratch,
        _outside_tune(optim.workers),
    ):
        storage, fs = shared if shared is not None else (local, None)
        os.environ.setdefault(*POLL_SECONDS)  # the controller gets Ray Train's variables from here
        trainer = TorchTrainer(
            loop,
            train_loop_config={"job": replace(job, rows=batch.num_rows, scratch=scratch)},
            scaling_config=ScalingConfig(
                num_workers=optim.workers,
                use_gpu=optim.use_gpu,
                resources_per_worker={"CPU": 1.0, "GPU": optim.gpus} if optim.use_gpu else None,
            ),
            datasets={"train": ray.data.from_arrow(batch)},
            run_config=RunConfig(
                storage_path=storage,
                storage_filesystem=fs,
                name=ctx.key,
                # a worker that dies (killed, out of memory, its node lost) restarts the group, and the
                # loop starts again from the same policy, batch and seed: the same result (tested)
                failure_config=FailureConfig(max_failures=WORKER_RESTARTS if optim.workers else 0),
            ),
        )
        restarts: int | None = 0
        try:
            need = {"GPU" if optim.use_gpu else "CPU": float(optim.workers)}  # Ray Train's default per worker
            with signals.watch_progress(ctx, Path(scratch)):
                result = watched(trainer.fit, need, f"{optim.workers} Ray Train worker(s)", stop=_stop_controllers)
            if result.checkpoint is None:
                raise RuntimeError("the training loop reported no checkpoint")
            result.checkpoint.to_directory(str(out))
            restarts = signals.restarts(Path(scratch))
        finally:
            if fs is not None:
                fs.delete_dir_contents(storage, missing_dir_ok=True)
    if restarts and hasattr(ctx, "warn"):
        ctx.warn(
            f"a Ray Train worker died and the worker group was restarted {restarts:g} time(s); the update ran again "
            "from the same policy, batch and seed",
            "perf/worker_restarts",
            float(restarts),
        )
    reported = result.metrics or {}
    if hasattr(ctx, "place"):
        for rank, where in enumerate(json.loads(reported.get(PLACES, "[]"))):
            ctx.place("worker", rank, where, None)
    metrics = {k: float(v) for k, v in reported.items() if isinstance(v, (int, float))}
    return metrics if restarts is None else metrics | {"perf/worker_restarts": float(restarts)}


@contextlib.contextmanager
def _outside_tune(workers: int) -> Iterator[None]:
    """Local mode runs the loop in this process; in a Ray Tune trial (a sweep) Ray
    Train would take the trial's session for its own and refuse `ray.train.report`.
    The trial's session is set aside for the fit and put back after it."""
    from ray.train._internal import session

    saved = session.get_session()
    hide = workers == 0 and saved is not None and saved.world_rank is None  # a Tune trial's session
    if hide:
        session._session = None
    try:
        yield
    finally:
        if hide:
            session._session = saved


def check_state_kept(checkpoint: ArtifactRef, optim: OptimConfig) -> None:
    """`UserError` when this fit would continue the optimizer state of `checkpoint`
    and `pipeline gc --optimizer-states` has removed it (`catalog.upkeep`): without
    the check AdamW would start afresh without a word, and the result would differ."""
    from catalog.store import Catalog

    if optim.keep_optimizer and f"{checkpoint.output}/{OPTIMIZER_FILE}" in Catalog(checkpoint.root).pruned(
        checkpoint.key
    ):
        raise UserError(
            f"result {checkpoint.key}: its optimizer state, which this update continues, was removed by "
            "`pipeline gc --optimizer-states`; -o update.optim.keep_optimizer=false (critic.optim for the "
            "critic) starts the optimizer afresh instead, a different result"
        )


def optimizer(model: Any, optim: OptimConfig, checkpoint: Path) -> Any:
    """AdamW over the model's parameters, resuming the state saved in `checkpoint`
    when there is one and `keep_optimizer` is on."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]  # a LoRA model: the adapter's only
    opt = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    state = checkpoint / OPTIMIZER_FILE
    if optim.keep_optimizer and state.exists():
        saved = torch.load(state, map_location="cpu")
        if sharded(model):
            load_optimizer_state(model, opt, saved)
        else:
            opt.load_state_dict(saved)
        for group in opt.param_groups:  # the spec's settings, not the saved ones
            group.update(lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    return opt


def prepare(model: Any, optim: OptimConfig) -> None:
    """Set `model` up for training under `optim`: gradient checkpointing, and TF32 matmuls
    on a GPU with bf16-mixed (the float32 matmuls left outside autocast)."""
    import torch

    if optim.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if optim.precision == "bf16-mixed" and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(optim: OptimConfig, device: Any) -> Any:
    """The context of a training forward pass: bfloat16 autocast with bf16-mixed (CPUs
    have it too), else nothing."""
    import torch

    kind = torch.device(device).type
    return torch.autocast(device_type=kind, dtype=torch.bfloat16, enabled=optim.precision == "bf16-mixed")


def step(model: Any, opt: Any, clip: float) -> float:
    """Sum the gradients over workers, clip them, step; the norm before clipping. A
    sharded model's gradients arrive reduce-scattered as the mean over the workers
    (FSDP2's default; gloo has no pre-scaled sum): times the workers, the sum."""
    import torch
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.grad is not None]
    workers = world()[1]
    if workers > 1 and sharded(model):
        for p in params:
            p.grad.mul_(workers)
    elif workers > 1:
        # every worker reduces the same parameters, in the same order, even one whose
        # mini-batch was empty (no gradient at all): which parameters any worker has a
        # gradient for is agreed first, and a worker without one adds zeros
        trainable = [p for p in model.parameters() if p.requires_grad]
        has = torch.tensor([float(p.grad is not None) for p in trainable], device=collective_device())
        dist.all_reduce(has)
        params = [p for p, n in zip(trainable, has.cpu().tolist()) if n > 0]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
    norm = torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def report(
    metrics: dict[str, float],
    save: Callable[[Path], None],
    opt_state: dict[str, Any] | None,
    optim: OptimConfig,
    scratch: str | None = None,
) -> None:
    """Report metrics, with the checkpoint (written by `save`, and the optimiser state
    `gather` gave) from rank 0. The checkpoint is written into `scratch` (the fit's
    folder beside the staged result, removed with it after the fit) where this worker
    can reach it; else into the system temp folder, removed once `report` has uploaded
    it (synchronously)."""
    import ray.train
    import torch

    from common.placement import here

    rank, size = world()
    places: list[Any] = [here()]
    if size > 1:  # every rank says where it ran; rank 0 reports them with the metrics (`fit`)
        places = [{} for _ in range(size)]
        torch.distributed.all_gather_object(places, here())
    if rank != 0:
        ray.train.report(metrics)
        return
    reported: dict[str, Any] = {**metrics, PLACES: json.dumps(places)}
    reachable = scratch is not None and Path(scratch).is_dir()
    folder = Path(tempfile.mkdtemp(prefix="ckpt-", dir=scratch if reachable else None))
    try:
        save(folder)
        if optim.keep_optimizer and opt_state is not None:
            torch.save(opt_state, folder / OPTIMIZER_FILE)
        ray.train.report(reported, checkpoint=ray.train.Checkpoint.from_directory(str(folder)))
    finally:
        if not reachable:
            shutil.rmtree(folder, ignore_errors=True)


def keep_checkpoint(source: Path, out: Path, info: str, key: str) -> None:
    """An empty batch (the filter kept no group): the next version is the same
    weights (and optimiser state) under the next version number."""
    shutil.copytree(source, out, dirs_exist_ok=True)
    meta = json.loads((out / info).read_text())
    (out / info).write_text(
        json.dumps({**meta, "version": meta["version"] + 1, "parent": key}, indent=1, sort_keys=True)
    )
