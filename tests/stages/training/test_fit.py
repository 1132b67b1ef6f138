"""The optimiser step of `stages.training.fit` over two gloo ranks when one rank's
mini-batch is empty (3 rows on 2 workers in mini-batches of 2 gives one worker the
shares [1, 0]): both ranks step alike, and as one rank holding every row would."""

from __future__ import annotations

import multiprocessing as mp
import os
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from stages.training.fit import OptimConfig
from stages.training.worker import mini_batches
from tests.stages.training.test_sharding import _port


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))


def _step(rank: int, world: int, port: int, out: Any) -> None:
    import torch.distributed as dist

    from stages.training.fit import step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=20))
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    try:
        if rank == 0:  # rank 1's mini-batch is empty: no forward, no gradient
            model(torch.ones(2, 4)).sum().backward()
        norm = step(model, opt, 1.0)
        out.put((rank, norm, [p.detach().numpy().copy() for p in model.parameters()]))
    except Exception as exc:  # a collective mismatch or its timeout: the test says so
        out.put((rank, None, repr(exc)))
    finally:
        if world > 1:
            dist.destroy_process_group()


def test_the_shares_of_three_rows_on_two_workers_leave_one_mini_batch_empty():
    optim = OptimConfig(mini_batch_size=2, epochs=1)
    assert [len(m) for m in mini_batches(1, 3, optim, seed=0)] == [1, 0]


def test_a_worker_with_an_empty_mini_batch_steps_in_step_with_the_other():
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _port()
    procs = [ctx.Process(target=_step, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, norm, weights = queue.get(timeout=120)
        got[rank] = (norm, weights)
    for p in procs:
        p.join(timeout=60)
    assert all(norm is not None for norm, _ in got.values()), got
    alone = ctx.Queue()
    single = ctx.Process(target=_step, args=(0, 1, _port(), alone))
    single.start()
    _, norm, weights = alone.get(timeout=120)
    single.join(timeout=60)
    for rank in (0, 1):
        assert np.isclose(got[rank][0], norm)
        for a, b in zip(got[rank][1], weights):
            assert np.allclose(a, b)


def test_a_checkpoint_reaches_the_driver_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A worker group's rank 0 writes the checkpoint and its optimiser state on its own node
    and hands each file over in chunks (`Group.files_to`): no call carries the whole of it."""
    from stages.training import group as groups

    member = groups.Member.__new__(groups.Member)
    member.outbox, member.model, member.tokenizer = None, object(), object()
    member.opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
    weights = bytes(range(256)) * 10

    def save_policy(model, tokenizer, out, **info):
        (out / "model.safetensors").write_bytes(weights)
        (out / "sub").mkdir()
        (out / "sub" / "config.json").write_text("{}")

    monkeypatch.setattr("stages.models.policy.save_policy", save_policy)
    calls: list[tuple[str, int]] = []

    def first(method, *args):
        out = getattr(member, method)(*args)
        calls.append((method, len(out) if isinstance(out, bytes) else 0))
        return out

    group = groups.Group.__new__(groups.Group)
    group._first = first  # type: ignore[method-assign]
    group.files_to(tmp_path / "out", 3, "parent", True, chunk=1000)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "out" / "sub" / "config.json").read_text() == "{}"
    assert (tmp_path / "out" / "optimizer.pt").stat().st_size > 0
    assert max(n for method, n in calls if method == "read_file") <= 1000
    assert calls[-1][0] == "drop_files" and member.outbox is None
