"""What each worker of a fit does with its part of the batch (`stages.training.loops`):
its shard and device, sums over the workers, mini-batches that are the same on every
worker, length-sorted micro-batches as tensors, and running sums of the metrics."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.models.batching import lengths, padded
from stages.training import signals
from stages.training.sharding import as_many_as_the_others, collective_device, world

if TYPE_CHECKING:
    from stages.training.fit import OptimConfig, TrainJob


def shard() -> pa.Table:
    """This worker's part of the batch."""
    import ray.train

    parts = list(ray.train.get_dataset_shard("train").iter_batches(batch_format="pyarrow", batch_size=None))
    return pa.concat_tables(parts) if parts else pa.table({})


def device() -> Any:
    import ray.train.torch

    return ray.train.torch.get_device()


def agreed(names: list[str]) -> list[str]:
    """The union of every worker's `names`, sorted (unchanged with one): collectives of
    lists whose lengths differ between workers error, or hang until the group's timeout."""
    import torch.distributed as dist

    if world()[1] == 1:
        return names
    gathered: list[list[str] | None] = [None] * world()[1]
    dist.all_gather_object(gathered, names)
    return sorted({n for got in gathered for n in got or ()})


def all_sum(values: list[float]) -> list[float]:
    """Sum numbers over the workers (unchanged with one)."""
    import torch
    import torch.distributed as dist

    if world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return t.cpu().tolist()


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
    signals.tell_start(job.scratch)
    for done, mini in enumerate(mini_batches(table.num_rows, job.rows, optim, job.seed)):
        signals.tell_progress(job.scratch, done, total)
        micros = []
        for rows in micro_batches(sizes, mini, optim.micro_batch_size):
            b = padded(table, rows, columns)
            b["temperature"] = torch.tensor(temperature.take(pa.array(rows)).to_pylist(), dtype=torch.float32)
            micros.append({k: v.to(device) for k, v in b.items()})
        if optim.strategy == "fsdp" and world()[1] > 1:
            micros = as_many_as_the_others(micros)
        tokens, count = all_sum([float(sum(float(b["loss_mask"].sum()) for b in micros)), float(len(mini))])
        yield micros, tokens, count


class Sums:
    """Running sums of weighted metrics (value x weight), and their averages."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.weight: dict[str, float] = {}

    def add(self, name: str, value: float, weight: float = 1.0) -> None:
        self.total[name] = self.total.get(name, 0.0) + value * weight
        self.weight[name] = self.weight.get(name, 0.0) + weight

    def means(self) -> dict[str, float]:
        names = agreed(sorted(self.total))  # a worker whose share was empty has fewer: every list the same
        totals = all_sum([self.total.get(n, 0.0) for n in names] + [self.weight.get(n, 0.0) for n in names])
        return {n: totals[i] / totals[len(names) + i] if totals[len(names) + i] else 0.0 for i, n in enumerate(names)}
