"""A worker group kept for the run: the resident trainer of ``optim.workers >= 1``.

`Group` starts ``workers`` Ray actors once (on the nodes with CPUs, reserving none, or one
GPU each with ``use_gpu``)
and joins them in one torch.distributed process group (gloo; NCCL on GPUs). Each member
holds a replica of the policy and its AdamW state; an update sends each member its
contiguous share of the batch through the object store, and the members run the same
loop as a Ray Train fit (`stages.training.loops.actor_steps`: gradients summed across
the group by hand, the same mini-batch count on every member). Rank 0 answers for the
group: the checkpoint's files, the weights for the engines, their digest.

A member that dies (killed, out of memory, its node lost) ends the group: `GroupLost`
says so, and the resident trainer (`stages.training.resident`) starts a new group on
the nodes left and brings it back to the update's starting policy from the nearest
stored version and the batches since, then runs the update again: the same result.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from catalog.datasets import ArtifactRef
from common import live

#: how long a member that failed is given to show whether a peer died (Ray marks a lost node's
#: actors dead within seconds)
LIVENESS_WAIT = 60.0
#: how long members that died are asked after when their own call failed (their nodes: `SHUN_SECONDS`)
DEAD_WAIT = 5.0
#: seconds a node where a member died is passed over by the next groups: Ray lists a lost node alive
#: for several seconds (until its health checks fail), and a member placed there dies again, spending
#: the update's restarts in a moment. Unless no other node has CPUs.
SHUN_SECONDS = 60.0
#: bytes of a checkpoint file handed from rank 0 to the driver in one call (`Group.files_to`)
CHUNK = 64 << 20


class _Shunned(dict[str, float]):
    """The run's slot (`common.live`): when each node that lost a member was last shunned."""

    def close(self) -> None:
        self.clear()


def _shunned() -> _Shunned:
    return live.slot("shunned nodes", _Shunned)


class GroupLost(RuntimeError):
    """A member of the worker group died; the group is gone."""


class Member:
    """One rank of the group (a Ray actor): its replica of the policy and optimiser."""

    def __init__(self, rank: int, world: int, use_gpu: bool, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.rank, self.world, self.use_gpu = rank, world, use_gpu
        self.model: Any = None
        self.tokenizer: Any = None
        self.opt: Any = None
        from stages.training.loops import KLReference

        self.reference = KLReference()
        self.policy: ArtifactRef | None = None  # the stored version loaded (`load`)
        self.outbox: Path | None = None  # the checkpoint `write_files` wrote, until `drop_files`

    def endpoint(self) -> tuple[str, int]:
        """(this node's address, a free port): where the group meets (rank 0's)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), int(s.getsockname()[1])

    def join(self, host: str, port: int) -> None:
        import datetime

        import torch.distributed as dist

        backend = "nccl" if self.use_gpu else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=datetime.timedelta(minutes=30),
        )

    def device(self) -> Any:
        import torch

        return torch.device("cuda", 0) if self.use_gpu else torch.device("cpu")

    def load(self, policy: ArtifactRef, optim: Any) -> None:
        """The stored `policy` and its optimiser state."""
        from stages.models.policy import load_policy
        from stages.training.fit import optimizer

        path = policy.local_path()
        self.model, self.tokenizer = load_policy(path, device=str(self.device()), dtype="float32")
        self.policy = policy
        self.opt = optimizer(self.model, optim, path)

    def apply(self, cfg: Any, table: Any, reference: ArtifactRef, seed: int, key: str, rows: int) -> dict[str, float]:
        """One update on this member's share of the batch (`rows`: the whole batch's)."""
        from stages.training.loops import ActorJob, actor_steps, continued

        self.opt, table = continued(self.model, self.opt, cfg, table)
        ref_logp = self.reference.logprobs(cfg, reference, str(self.device()))
        assert self.policy is not None, "load first"
        job = ActorJob(key=key, seed=seed, cfg=cfg, policy=self.policy, reference=reference, rows=rows)
        # rank 0 says where its loop is (`stages.training.signals`) in a folder on its own node
        with tempfile.TemporaryDirectory(prefix=".train-") as scratch:
            return actor_steps(self.model, self.opt, ref_logp, table, cfg, replace(job, scratch=scratch), self.device())

    def write_files(self, version: int, parent: str, keep_optimizer: bool) -> dict[str, int]:
        """Rank 0: write the checkpoint's files (and the optimiser state) into a folder of
        its own on its node; their sizes, by name. `read_file` hands them over a chunk at a
        time and `drop_files` removes them."""
        import torch

        from stages.models.policy import save_policy
        from stages.training.fit import OPTIMIZER_FILE

        self.drop_files()
        self.outbox = Path(tempfile.mkdtemp(prefix="ckpt-"))
        save_policy(self.model, self.tokenizer, self.outbox, version=version, parent=parent)
        if keep_optimizer:
            torch.save(self.opt.state_dict(), self.outbox / OPTIMIZER_FILE)
        files = sorted(p for p in self.outbox.rglob("*") if p.is_file())
        return {p.relative_to(self.outbox).as_posix(): p.stat().st_size for p in files}

    def read_file(self, name: str, offset: int, size: int) -> bytes:
        """Rank 0: `size` bytes of a file `write_files` wrote, from `offset`."""
        assert self.outbox is not None, "read_file() before write_files()"
        with open(self.outbox / name, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def drop_files(self) -> None:
        """Rank 0: remove what `write_files` wrote."""
        import shutil

        if self.outbox is not None:
            shutil.rmtree(self.outbox, ignore_errors=True)
            self.outbox = None

    def state(self) -> dict[str, Any]:
        """Rank 0: the weights for the engines (`engine_state`)."""
        from stages.models.policy import engine_state

        return engine_state(self.model)

    def digest(self) -> str:
        from stages.training.loops import weights_digest

        return weights_digest(self.model)

    def where(self) -> dict[str, str | None]:
        from common.placement import here

        return here()

    def pid(self) -> int:
        return os.getpid()


class Group:
    """The driver's handle on the members (module docstring)."""

    def __init__(self, workers: int, use_gpu: bool, gpus: float = 1.0) -> None:
        import ray

        from stages.lost_nodes import watched

        self.workers, self.use_gpu, self.gpus = workers, use_gpu, gpus
        # a member lives for the run: holding CPUs (even a share: a node left with 0.99 of a CPU runs no Ray
        # Data task) would starve Ray Data and the engine actors (stages.engines.hosts), so on CPUs it
        # reserves none; it is placed on the live nodes that have CPUs, in turn, and runs one torch thread
        # (as a Ray Train worker did, so sums are taken in the same order)
        need = {"GPU": workers * gpus} if use_gpu else {}

        self._started: list[Any] = []  # the members so far (asked after should the start fail: `_shun_the_dead`)
        self.nodes: list[str | None] = [None] * workers  # each member's node: asked for, then where it runs

        def start() -> list[Any]:
            started = self._started
            started.extend(self._remote(rank).remote(rank, workers, use_gpu, 1) for rank in range(workers))
            host, port = ray.get(started[0].endpoint.remote())
            ray.get([m.join.remote(host, port) for m in started])
            self.nodes = [w["node"] for w in ray.get([m.where.remote() for m in started])]
            return started

        def stop() -> None:  # nodes lost: the members started so far go, and the start ends with them
            for member in self._started:
                ray.kill(member, no_restart=True)

        try:
            self.members = self._call(lambda: watched(start, need, f"{workers} trainer worker(s)", stop=stop))
        except BaseException:  # a start that failed however (a member that died, an interrupt): none is left
            stop()
            raise

    def _remote(self, rank: int) -> Any:
        """Member `rank`'s actor class with its resources: `gpus` of a GPU, or on CPUs no reservation
        and a place on a live node with CPUs (rank by rank over them). The place is held
        to (hard node affinity): Ray places an actor that reserves nothing on a node drawn
        at random, whatever a *soft* affinity asks (its scheduler's rule for actors of no
        resources), so a member could land on a head that has no CPUs. Should that node
        die before the member starts, the member dies: the group is lost and started
        again, and the node is passed over (`_shun_the_dead`)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.use_gpu:
            return ray.remote(Member).options(num_cpus=0, num_gpus=self.gpus)
        alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0)
        now = time.monotonic()
        nodes = [n for n in alive if now - _shunned().get(n, -SHUN_SECONDS) >= SHUN_SECONDS] or alive
        if not nodes:
            return ray.remote(Member).options(num_cpus=0)
        node = self.nodes[rank] = nodes[rank % len(nodes)]
        where = NodeAffinitySchedulingStrategy(node, soft=False)
        return ray.remote(Member).options(num_cpus=0, scheduling_strategy=where)

    def _call(self, fn: Any) -> Any:
        """``fn()``; a member's death is `GroupLost`. A member that failed because a peer
        died (its collective lost the connection before Ray marked the peer dead) is one too:
        on a task error every member is asked whether it lives before the error is believed."""
        from ray.exceptions import ActorUnschedulableError, RayActorError, RayTaskError

        try:
            return fn()
        except (RayActorError, ActorUnschedulableError) as exc:  # unschedulable: its node died before it started
            self._shun_the_dead(DEAD_WAIT)
            raise GroupLost(f"a trainer worker died: {str(exc).splitlines()[0]}") from exc
        except RayTaskError as exc:
            dead = self._shun_the_dead(LIVENESS_WAIT)
            if dead:
                raise GroupLost(f"a trainer worker died: {dead[0]}") from exc
            raise

    def _shun_the_dead(self, wait: float) -> list[str]:
        """Why each member that does not answer within `wait` seconds in all is dead (Ray may
        take a few seconds to see that a node is gone); the nodes of those are passed over
        by the next groups for `SHUN_SECONDS`."""
        import ray
        from ray.exceptions import ActorUnschedulableError, GetTimeoutError, RayActorError

        deadline, why = time.monotonic() + wait, []
        for rank, member in enumerate(self._started):
            try:
                ray.get(member.pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
                continue
            except (RayActorError, ActorUnschedulableError) as exc:
                why.append(str(exc).splitlines()[0])
            except GetTimeoutError:
                why.append("a member did not answer")
            node = self.nodes[rank]
            if node is not None:
                _shunned()[node] = time.monotonic()
        return why

    def _all(self, method: str, *args: Any) -> list[Any]:
        import ray

        return self._call(lambda: ray.get([getattr(m, method).remote(*args) for m in self.members]))

    def _first(self, method: str, *args: Any) -> Any:
        import ray

        return self._call(lambda: ray.get(getattr(self.members[0], method).remote(*args)))

    def load(self, policy: ArtifactRef, optim: Any) -> None:
        self._all("load", policy, optim)

    def apply(self, cfg: Any, table: Any, reference: ArtifactRef, seed: int, key: str) -> dict[str, float]:
        """One update: member r trains on the r-th contiguous share of `table`'s rows."""
        import numpy as np
        import ray

        rows = table.num_rows
        shares = [table.take(part) for part in np.array_split(np.arange(rows), self.workers)]
        refs = [ray.put(share) for share in shares]

        def run() -> list[dict[str, float]]:
            calls = [
                m.apply.remote(cfg, r, reference, seed, key, rows) for m, r in zip(self.members, refs, strict=True)
            ]
            return ray.get(calls)

        return dict(self._call(run)[0])

    def files_to(self, out: Path, version: int, parent: str, keep_optimizer: bool, chunk: int = CHUNK) -> None:
        """The checkpoint's files (and the optimiser state) written into `out`, each
        fetched from rank 0 a chunk at a time: the driver and the object store hold one
        chunk, not the checkpoint and its optimiser state at once."""
        sizes = dict(self._first("write_files", version, parent, keep_optimizer))
        try:
            for name, size in sizes.items():
                target = out / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    for offset in range(0, size, chunk):
                        f.write(self._first("read_file", name, offset, chunk))
        finally:
            with contextlib.suppress(GroupLost):  # a member lost now: the restart frees its node's folder
                self._first("drop_files")

    def state(self) -> dict[str, Any]:
        return dict(self._first("state"))

    def digest(self) -> str:
        return str(self._first("digest"))

    def places(self) -> list[dict[str, str | None]]:
        return list(self._all("where"))

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            for m in self.members:
                ray.kill(m, no_restart=True)
