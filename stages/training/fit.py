"""Training on a batch with Ray Train: one loop, in-process or on N workers.

`fit` hands the batch to a Ray Train `TorchTrainer` as a Ray Data dataset. With
``workers: 0`` Ray Train runs the loop in this process (local mode: no worker
start-up, the CPU default); with N it runs the *same* loop on N workers, each
reading its shard. The loop reports its metrics and a checkpoint folder from rank
0, which `fit` copies into the stage's output.

The pieces every loop shares live here: the optimiser (AdamW, its state carried
from one policy version to the next in the checkpoint), mini-batches that are the
same on every worker, length-sorted micro-batches, and the step (gradients
summed across workers by hand, clipped, applied). Gradients are all-reduced by
hand rather than through DDP because the forward pass runs the decoder and the
output head separately (`stages.models.critic`), which DDP's wrapper would not see.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.config import ConfigProblem, param
from stages.models.batching import lengths, padded

OPTIMIZER_FILE = "optimizer.pt"


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
    use_gpu: bool = param(False, "one GPU per worker")
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


#: restarts of the Ray Train worker group after a worker dies, per fit (``workers >= 1``)
WORKER_RESTARTS = 2
#: the metric that counts them, declared by every stage that fits (`update`, `critic.update`)
RESTARTS_METRIC = {
    "perf/worker_restarts": "times Ray Train restarted the worker group after a worker died (killed, out of memory, "
    "its node lost); the update ran again from the same policy, batch and seed; also a row of the run's events"
}


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
        trainer = TorchTrainer(
            loop,
            train_loop_config={"job": replace(job, rows=batch.num_rows, scratch=scratch)},
            scaling_config=ScalingConfig(num_workers=optim.workers, use_gpu=optim.use_gpu),
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
        restarts = 0
        try:
            with _watch_progress(ctx, Path(scratch) / PROGRESS_FILE):
                result = trainer.fit()
            if result.checkpoint is None:
                raise RuntimeError("the training loop reported no checkpoint")
            result.checkpoint.to_directory(str(out))
            restarts = _restarts(Path(scratch))
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
    metrics = {k: float(v) for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    return metrics | {"perf/worker_restarts": float(restarts)}


#: rank 0's mini-batches done and in all, written into the scratch folder as the loop goes
PROGRESS_FILE = "progress.json"


@contextlib.contextmanager
def _watch_progress(ctx: Any, path: Path, every: float = 1.0) -> Iterator[None]:
    """While the fit runs, pass what the loop writes to `path` (`batches`) on to
    `ctx.progress` (a `StageContext`; other contexts have none). Workers on another
    machine write theirs where this one cannot see it: the run then shows the step as
    running, without a count."""
    report = getattr(ctx, "progress", None)
    if report is None:
        yield
        return
    import threading

    stop = threading.Event()

    def poll() -> None:
        seen = None
        while not stop.wait(every):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                done, total = (int(x) for x in json.loads(path.read_text())["mini_batches"])
                if (done, total) != seen:
                    seen = (done, total)
                    report(done, total, "mini-batches")

    thread = threading.Thread(target=poll, name="fit-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


#: a line per start of the training loop on rank 0, in the scratch folder: more than one
#: is a restart of the worker group
STARTS_FILE = "starts"


def _tell_start(job: TrainJob) -> None:
    if job.scratch is None or _world()[0] != 0:
        return
    with contextlib.suppress(OSError), open(Path(job.scratch) / STARTS_FILE, "a") as f:
        f.write("start\n")


def _restarts(scratch: Path) -> int:
    """Restarts of the worker group in this fit (workers on another machine: not seen, 0)."""
    try:
        return max(0, len((scratch / STARTS_FILE).read_text().splitlines()) - 1)
    except OSError:
        return 0


def _tell_progress(job: TrainJob, done: int, total: int) -> None:
    """Rank 0 writes how many mini-batches it has done (`_watch_progress` reads it)."""
    if job.scratch is None or _world()[0] != 0:
        return
    path = Path(job.scratch) / PROGRESS_FILE
    with contextlib.suppress(OSError):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"mini_batches": [done, total]}))
        tmp.replace(path)


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


def shard() -> pa.Table:
    """This worker's part of the batch."""
    import ray.train

    parts = list(ray.train.get_dataset_shard("train").iter_batches(batch_format="pyarrow", batch_size=None))
    return pa.concat_tables(parts) if parts else pa.table({})


def device() -> Any:
    import ray.train.torch

    return ray.train.torch.get_device()


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_sum(values: list[float]) -> list[float]:
    """Sum numbers over the workers (unchanged with one)."""
    import torch
    import torch.distributed as dist

    if _world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def mini_batches(rows: int, total_rows: int, optim: OptimConfig, seed: int) -> Iterator[np.ndarray]:
    """Row indices of each mini-batch of every epoch (shuffled, seeded). Every worker
    yields the same number of mini-batches (from the batch's total size), so the
    workers' gradient sums stay in step."""
    steps = max(1, math.ceil(total_rows / optim.mini_batch_size))
    rng = np.random.default_rng(seed)
    for _ in range(optim.epochs):
        yield from np.array_split(rng.permutation(rows), steps)


def micro_batches(sizes: np.ndarray, rows: np.ndarray, size: int) -> list[np.ndarray]:
    """`rows` in groups of `size`, of similar sizes (less padding)."""
    ordered = rows[np.argsort(sizes[rows], kind="stable")]
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def sampled_tokens(table: pa.Table) -> float:
    """Sampled (loss-mask) tokens of the batch, summed over the workers."""
    return all_sum([float(pc.sum(pc.list_flatten(table.column("loss_mask"))).as_py() or 0)])[0]


def batches(
    table: pa.Table, optim: OptimConfig, job: TrainJob, extra: dict[str, Any], device: Any
) -> Iterator[tuple[list[dict[str, Any]], float, float]]:
    """Per mini-batch: its micro-batches as tensors on `device` (token_ids,
    loss_mask, attention, temperature and the `extra` list columns), and the
    mini-batch's sampled tokens and rows summed over the workers (for `aggregate`)."""
    import torch

    sizes = lengths(table)
    columns = {"token_ids": torch.long, "loss_mask": torch.long, **extra}
    temperature = table.column("temperature")
    total = optim.epochs * max(1, math.ceil(job.rows / optim.mini_batch_size))
    _tell_start(job)
    for done, mini in enumerate(mini_batches(table.num_rows, job.rows, optim, job.seed)):
        _tell_progress(job, done, total)
        micros = []
        for rows in micro_batches(sizes, mini, optim.micro_batch_size):
            b = padded(table, rows, columns)
            b["temperature"] = torch.tensor(temperature.take(pa.array(rows)).to_pylist(), dtype=torch.float32)
            micros.append({k: v.to(device) for k, v in b.items()})
        if optim.strategy == "fsdp" and _world()[1] > 1:
            micros = _as_many_as_the_others(micros)
        tokens, count = all_sum([float(sum(float(b["loss_mask"].sum()) for b in micros)), float(len(mini))])
        yield micros, tokens, count


def _as_many_as_the_others(micros: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A sharded model's forward and backward are collective: every worker must run as
    many micro-batches as the others. A worker with fewer repeats its last one with no
    sampled token (no loss, no gradient, no weight in the metrics)."""
    import torch
    import torch.distributed as dist

    most = torch.tensor([len(micros)])
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    if not micros and int(most):
        raise RuntimeError("strategy fsdp: a worker got no rows of a mini-batch; use a larger batch or fewer workers")
    empty = [{**micros[-1], "loss_mask": torch.zeros_like(micros[-1]["loss_mask"])}] if micros else []
    return micros + empty * (int(most) - len(micros))


def gather(model: Any, opt: Any, optim: OptimConfig) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the full weights, the optimiser state) to save, on rank 0 (None elsewhere, and
    for the weights of a model that is not sharded: it saves itself). Collective for a
    sharded model: every worker calls it. The optimiser state has the form
    `opt.state_dict()` gives an unsharded model, whatever the strategy, so a checkpoint
    resumes under either."""
    rank = _world()[0]
    if not sharded(model):
        return None, (opt.state_dict() if optim.keep_optimizer and rank == 0 else None)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    by_name: Any = get_optimizer_state_dict(model, opt, options=full) if optim.keep_optimizer else None
    if rank != 0:
        return None, None
    if by_name is None:
        return weights, None
    index = {name: i for i, name in enumerate(_trained_names(model))}
    return weights, {
        "state": {index[name]: s for name, s in by_name["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]],
    }


def unsharded(build: Callable[[], Any], weights: dict[str, Any]) -> Any:
    """A fresh unsharded model (`build`) holding `weights` (`gather`'s), to save."""
    model = build()
    model.load_state_dict(weights)
    return model


def _trained_names(model: Any) -> list[str]:
    """The names of the parameters `optimizer` optimises, in its order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def optimizer(model: Any, optim: OptimConfig, checkpoint: Path) -> Any:
    """AdamW over the model's parameters, resuming the state saved in `checkpoint`
    when there is one and `keep_optimizer` is on."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]  # a LoRA model: the adapter's only
    opt = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    state = checkpoint / OPTIMIZER_FILE
    if optim.keep_optimizer and state.exists():
        saved = torch.load(state, map_location="cpu")
        if sharded(model):  # the saved form (`gather`) by parameter name, shards taken by each worker
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            names = _trained_names(model)
            by_name: Any = {
                "state": {names[int(i)]: s for i, s in saved["state"].items()},
                "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in saved["param_groups"]],
            }
            set_optimizer_state_dict(model, opt, by_name, options=StateDictOptions(full_state_dict=True))
        else:
            opt.load_state_dict(saved)
        for group in opt.param_groups:  # the spec's settings, not the saved ones
            group.update(lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    return opt


def step(model: Any, opt: Any, clip: float) -> float:
    """Sum the gradients over workers, clip them, step; the norm before clipping. A
    sharded model's gradients arrive reduce-scattered as the mean over the workers
    (FSDP2's default; gloo has no pre-scaled sum): times the workers, the sum."""
    import torch
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.grad is not None]
    world = _world()[1]
    if world > 1:
        for p in params:
            if sharded(model):
                p.grad.mul_(world)
            else:
                dist.all_reduce(p.grad)
    norm = torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def sharded(model: Any) -> bool:
    """Whether `model` was sharded by `distribute`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def distribute(model: Any, optim: OptimConfig) -> Any:
    """With ``strategy: fsdp`` on several workers, shard `model` with FSDP2: each module
    that holds parameters of its own becomes a unit (a decoder layer with all it holds;
    modules that share a parameter, such as tied input and output embeddings, one unit
    together), then the decoder around its layers, then the whole model. Every unit
    gathers its parameters when its own forward runs, so the prefix-sharing forward
    (`stages.models.forward`), which calls the decoder and the output head separately,
    works unchanged. Otherwise `model`."""
    if optim.strategy != "fsdp" or _world()[1] < 2:
        return model
    from torch.distributed.fsdp import fully_shard

    names = {id(m): n for n, m in model.named_modules()}
    units: list[list[Any]] = []
    taken: set[str] = set()  # names of the modules already inside a unit

    def inside(name: str) -> bool:
        return any(name == t or name.startswith(t + ".") for t in taken)

    decoders = []
    for name, module in model.named_modules():
        if name.endswith(".layers") and hasattr(module, "__len__"):
            for i, layer in enumerate(module):
                units.append([layer])
                taken.add(f"{name}.{i}")
            decoders.append(name.rsplit(".", 1)[0])
    owners: dict[int, list[Any]] = {}  # parameter -> the other modules that hold it directly
    for name, module in model.named_modules():
        if inside(name) or not any(True for _ in module.parameters(recurse=False)):
            continue
        group = next((owners[id(p)] for p in module.parameters(recurse=False) if id(p) in owners), None)
        if group is None:
            group = []
            units.append(group)
        group.append(module)
        for p in module.parameters(recurse=False):
            owners[id(p)] = group
    for unit in units:
        if unit and names.get(id(unit[0]), "") != "":  # the root is sharded last, over what is left
            fully_shard(unit if len(unit) > 1 else unit[0])
    modules = dict(model.named_modules())
    for name in decoders:  # the decoder a forward pass calls first: FSDP's root for that pass
        fully_shard(modules[name])
    fully_shard(model)
    return model


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

    if _world()[0] != 0:
        ray.train.report(metrics)
        return
    here = scratch is not None and Path(scratch).is_dir()
    folder = Path(tempfile.mkdtemp(prefix="ckpt-", dir=scratch if here else None))
    try:
        save(folder)
        if optim.keep_optimizer and opt_state is not None:
            torch.save(opt_state, folder / OPTIMIZER_FILE)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)))
    finally:
        if not here:
            shutil.rmtree(folder, ignore_errors=True)


class Sums:
    """Running sums of weighted metrics (value x weight), and their averages."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.weight: dict[str, float] = {}

    def add(self, name: str, value: float, weight: float = 1.0) -> None:
        self.total[name] = self.total.get(name, 0.0) + value * weight
        self.weight[name] = self.weight.get(name, 0.0) + weight

    def means(self) -> dict[str, float]:
        names = sorted(self.total)
        totals = all_sum([self.total[n] for n in names] + [self.weight[n] for n in names])
        return {n: totals[i] / totals[len(names) + i] if totals[len(names) + i] else 0.0 for i, n in enumerate(names)}


def keep_checkpoint(source: Path, out: Path, info: str, key: str) -> None:
    """An empty batch (the filter kept no group): the next version is the same
    weights (and optimiser state) under the next version number."""
    shutil.copytree(source, out, dirs_exist_ok=True)
    meta = json.loads((out / info).read_text())
    (out / info).write_text(
        json.dumps({**meta, "version": meta["version"] + 1, "parent": key}, indent=1, sort_keys=True)
    )
