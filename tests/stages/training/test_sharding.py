"""FSDP2 as `stages.training.sharding.distribute` shards it equals DDP on a tiny random
Qwen2 with tied input and output embeddings (the architecture of the Qwen2.5 and SmolLM2
checkpoints users train): one AdamW step over two gloo ranks, each rank its own batch.
(tests/stages/test_fsdp.py holds the same for the whole update stage, LoRA and critic
included, on the embedded model.)"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from typing import Any

import torch

from tests.conftest import ACROSS_PROCESSES
from tests.stages.conftest import tiny_qwen2


def _one_step(rank: int, port: int, out: Any) -> None:
    """On gloo rank `rank` of two: one AdamW step with DDP, then one from the same start
    with FSDP2 (the same two processes: starting them costs more than the steps)."""
    import torch.distributed as dist

    from stages.training.fit import OptimConfig, step
    from stages.training.sharding import distribute, gather

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for strategy in ("ddp", "fsdp"):
        optim = OptimConfig(workers=2, strategy=strategy)  # type: ignore[arg-type]
        model = distribute(tiny_qwen2(tie=True), optim)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(rank))
        model(input_ids=ids, labels=ids).loss.backward()
        norm = step(model, opt, 1.0)
        weights, _ = gather(model, opt, optim)
        if rank == 0:
            weights = weights if weights is not None else model.state_dict()
            out.put((strategy, norm, {k: v.detach().numpy().copy() for k, v in weights.items()}))  # not shared
    # both ranks leave together: a rank that tore its gloo context down while the other still held the
    # connection once ended the other in SIGABRT ("terminate called without an active exception"), the
    # results already sent, under a loaded suite
    dist.barrier()
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@ACROSS_PROCESSES
def test_fsdp_equals_ddp_on_a_tiny_tied_qwen2():
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _port()
    procs = [ctx.Process(target=_one_step, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(2):
        strategy, norm, weights = queue.get(timeout=300)
        results[strategy] = (norm, weights)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, p.exitcode
    (ddp_norm, ddp), (fsdp_norm, fsdp) = (
        (norm, {k: torch.from_numpy(v) for k, v in w.items()}) for norm, w in (results["ddp"], results["fsdp"])
    )
    before = tiny_qwen2(tie=True).state_dict()
    names = [k for k in ddp if k != "lm_head.weight"]  # tied: the same tensor as the input embedding
    assert set(names) <= set(fsdp) and names
    assert abs(ddp_norm - fsdp_norm) < 1e-4 * ddp_norm
    # lr 1e-3 moves every weight by about 1e-3 (AdamW's first step); the two differ by float32 noise
    assert all((ddp[k] - before[k]).abs().max() > 1e-4 for k in names if "norm" not in k)
    assert all(torch.allclose(ddp[k], fsdp[k], atol=1e-6) for k in names)


def test_under_nccl_every_collective_tensor_is_made_on_the_gpu(monkeypatch):
    """NCCL has no CPU backend: a CPU tensor in all_reduce raises at the first mini-batch of
    a run with two GPU workers. Every collective of the update's loops takes its tensor on
    `collective_device()`, which is the GPU under NCCL. Seen on CPU: the NCCL group is
    pretended, and the device each all_reduce receives is the one collective_device gave."""
    import torch.distributed as dist

    from stages.training import fit, sharding, worker

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert sharding.collective_device() == torch.device("cuda", 0)

    given: list[torch.device] = []
    seen: list[torch.device] = []

    def device() -> torch.device:
        given.append(torch.device("cpu"))  # where a GPU worker would say cuda:0
        return given[-1]

    for module in (fit, sharding, worker):
        monkeypatch.setattr(module, "collective_device", device)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: seen.append(t.device))
    worker.all_sum([1.0, 2.0])
    sharding.as_many_as_the_others([{"loss_mask": torch.ones(2)}])
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    fit.step(model, torch.optim.SGD(model.parameters(), lr=0.1), 1.0)
    assert len(given) == 3 and len(seen) == 3 + 2  # the agreement on which grads exist, then each grad
    assert seen[:3] == given
