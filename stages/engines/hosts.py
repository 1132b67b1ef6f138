"""Engine hosts: generation engines that outlive a stage.

An `EngineHost` holds one engine and brings it to the policy each call names: the
first call builds the engine; a later call with another checkpoint of the same
architecture and tokenizer (every policy version of a run) loads the new weights
into it (`Engine.load_weights`); a checkpoint of another model builds a new engine.
It counts what it did and how long it took (`ENGINE_METRICS`, in the rollout's
and eval's metrics).

With ``actors: 0`` the rollout and eval use one host in their own process
(`local_host`). With ``actors: N`` they use a pool of N host *actors*
(`ray_pool`): Ray actors created on first use and kept for the rest of the run
(`common.live`), so every iteration's rollout and eval reuse the engines built once;
they end with the run, even where its Ray session goes on. A Ray Data
dataset of episode specs, one block per actor, is mapped by `forward` tasks that
hand each block to its host (`play_on_ray`).

Failures: a host actor that dies (killed, out of memory) is restarted by Ray
(`RESTARTS`), and the call it was running is retried on the new process
(`max_task_retries`), which rebuilds the engine and replays the batch from the
same seeds, so the result is the one an uninterrupted call gives. A host that stays
dead fails the stage with an error; the pool is dropped and the next stage builds
a fresh one. Nothing waits without end on a dead actor, nor on a lost node whose
actors the nodes left cannot hold (`stages.lost_nodes`).

CPUs: by default a host actor reserves no Ray CPU and runs ``threads`` torch
threads (the node's CPUs shared among the actors). Ray Data cannot schedule its
tasks when actors hold every logical CPU (ray-project/ray#44687), which a CPU
machine with one actor would otherwise do; an explicit ``actor_cpus`` reserves
that many CPUs per actor and must leave one free.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from common import live
from common.errors import UserError
from stages.engines import Engine, EngineSettings, make_engine
from stages.engines.weights import MEMORY, Policy, Weights, architecture, engine_policy, from_memory
from stages.lost_nodes import NodesLost, patient, watched

__all__ = [
    "ENGINE_METRICS",
    "MEMORY",
    "EngineHost",
    "Policy",
    "Weights",
    "architecture",
    "drop_pool",
    "engine_policy",
    "from_memory",
    "local_host",
    "play_on_ray",
    "ray_pool",
]

#: how often Ray restarts a host actor that died, and retries the call it was running
RESTARTS = 3
#: the label every Ray node has with its id (`ray._raylet.RAY_NODE_ID_KEY`)
NODE_LABEL = "ray.io/node-id"


class EngineHost:
    """Holds one engine of kind `engine` and runs functions on it, with the
    policy a call names loaded (see the module docstring)."""

    def __init__(self, engine: str, threads: int | None = None, options: tuple[tuple[str, Any], ...] = ()) -> None:
        self.kind, self.threads, self.options = engine, threads, dict(options)
        self.engine: Engine | None = None
        self.arch = self.policy = ""
        self._zero()
        self.restarts = int(_reconstructed())  # this actor's process replaces one that died

    def _zero(self) -> None:
        self.builds = self.loads = self.memory_loads = 0
        self.seconds = {"generate": 0.0, "load": 0.0, "play": 0.0}

    def _bring(self, policy: Policy) -> Engine:
        if isinstance(policy, Weights):
            name = policy.name
        else:
            name = str(policy) if isinstance(policy, Path) else f"{policy.root.uri}/{policy.address}"
        if self.engine is not None and name == self.policy:
            return self.engine
        if isinstance(policy, Weights):
            path = policy.base.local_path()  # the stored policy it was trained from: config and tokenizer
        else:
            path = policy if isinstance(policy, Path) else policy.local_path()
        arch = architecture(path)
        if self.engine is not None and arch == self.arch:
            if isinstance(policy, Weights):
                self.engine.load_state(policy.tensors())
                self.memory_loads += 1
            elif self.engine.load_weights(path):
                self.loads += 1
            else:  # the engine rebuilt itself (vLLM on CPU)
                self.builds += 1
        else:
            if self.threads:
                import torch

                torch.set_num_threads(self.threads)
            self.engine = None  # free the old model before building the new one
            self.engine = make_engine(self.kind, path, **self.options)
            self.builds += 1
            if isinstance(policy, Weights):
                self.engine.load_state(policy.tensors())
                self.memory_loads += 1
        self.arch, self.policy = arch, name
        return self.engine

    def run(self, policy: Policy, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(engine, *args)`` with `policy` loaded into the engine."""
        t0 = time.perf_counter()
        engine = self._bring(policy)
        t1 = time.perf_counter()
        try:
            return fn(_Timed(engine, self.seconds), *args)
        finally:
            rest = getattr(engine, "rest", None)  # vLLM's sleep between plays (`VLLMSettings.sleep`)
            if rest is not None:
                rest()
            self.seconds["load"] += t1 - t0
            self.seconds["play"] += time.perf_counter() - t0

    def counters(self) -> dict[str, float]:
        """What the host did since the last call (`ENGINE_METRICS`)."""
        out = {
            "perf/engine_restarts": self.restarts,
            "perf/engine_builds": self.builds,
            "perf/weight_loads": self.loads,
            "perf/memory_weight_loads": self.memory_loads,
            **{f"perf/{k}_seconds": v for k, v in self.seconds.items()},
        }
        self._zero()
        self.restarts = 0
        return out

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, str | None]:
        """This actor's place (`common.placement.here`)."""
        from common.placement import here

        return here()


def _reconstructed() -> bool:
    """Whether this process is a Ray actor restarted after its process died."""
    try:
        import ray

        return ray.is_initialized() and bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not an actor (the in-process host), or a Ray without the flag
        return False


#: what hosts report, summed over the actors of a stage (the rollout and eval metrics)
ENGINE_METRICS = {
    "perf/engine_restarts": "engine actors that died (killed, out of memory, their node lost) and were restarted "
    "by Ray in the stage; the call they ran was replayed from the same seeds, and a warning says so",
    "perf/engine_builds": "engines built in the stage: the first use of an engine host, a restarted actor, a new "
    "model, or vLLM's rebuild on CPU",
    "perf/weight_loads": "policy checkpoints read from storage into an engine already built",
    "perf/memory_weight_loads": "policy versions loaded into an engine from the trainer's memory, in this process or "
    "through Ray's object store, without a catalog read (stages.training.resident)",
    "perf/generate_seconds": "seconds inside the engine's generate (model compute), summed over the actors",
    "perf/load_seconds": "seconds building engines and loading weights, summed over the actors",
    "perf/play_seconds": "seconds the engine hosts spent on the stage's episodes (loads, the agent loop, the "
    "environments and generate), summed over the actors",
}


class _Timed:
    """An engine whose model time (generate, and score for forced answers) is added to `seconds['generate']`."""

    def __init__(self, engine: Engine, seconds: dict[str, float]) -> None:
        self.engine, self.seconds, self.tokenizer = engine, seconds, engine.tokenizer

    def _timed(self, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds["generate"] += time.perf_counter() - t0

    def generate(self, prompts: list[list[int]], params: Any) -> Any:
        return self._timed(self.engine.generate, prompts, params)

    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float) -> Any:
        return self._timed(self.engine.score, prompts, responses, temperature)


class _Hosts(dict[str, EngineHost]):
    """The run's slot (`common.live`): this process's engine host (one at a time)."""

    def close(self) -> None:
        self.clear()  # the engine and the weights it loaded go with it


def local_host(engine: str, options: tuple[tuple[str, Any], ...] = ()) -> EngineHost:
    """This process's host for `engine` with these constructor `options` (one at a time,
    kept across the run's iterations)."""
    hosts = live.slot("engine host", _Hosts)
    name = f"{engine}{options}"
    if name not in hosts:
        hosts.clear()  # one engine in memory at a time
        hosts[name] = EngineHost(engine, options=options)
    return hosts[name]


@dataclass
class _Pool:
    key: tuple[Any, ...]
    hosts: list[Any]  # Ray actor handles


class _Pools(dict[tuple[Any, ...], _Pool]):
    """The run's slot (`common.live`): its engine pools by their settings. A rollout on vLLM
    and an eval on `hf` keep a pool each, instead of one pool dropped and built again at
    every switch (the resource plan counts each: `stages.registry.engine_claims`). Closed
    with the run: its actors are killed, so a next run in the same Ray session (kept with
    ``PIPELINE_KEEP_RAY``) starts its own, with nothing of this run's engines or weights."""

    def close(self) -> None:
        drop_pool(pools=self)


def _pools() -> _Pools:
    return live.slot("engine pools", _Pools)


def _session() -> str:
    """What tells one Ray session from the next (job ids restart at 1 with each local
    session, so the session's name when Ray tells it)."""
    import ray

    worker = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(getattr(worker, "global_worker", None), "node", None)
    context = ray.get_runtime_context()
    return f"{getattr(node, 'session_name', '')}/{context.get_job_id()}/{context.get_node_id()}"


def ray_pool(
    engine: str, actors: int, cpus: float | None, gpus: float, options: tuple[tuple[str, Any], ...] = ()
) -> list[Any]:
    """The session's `actors` host actors for `engine` with these resources, created
    on first use and kept for the session beside the pools of other settings."""
    import ray

    pools = _pools()
    key = (_session(), engine, actors, cpus, gpus, options)
    if key in pools:
        return pools[key].hosts
    for old in [k for k in pools if k[0] != key[0]]:  # the pools of an ended session
        drop_pool(old)
    total = ray.cluster_resources().get("CPU", 1.0)
    held = sum(k[2] * (k[3] or 0.0) for k in pools)
    if cpus is not None and cpus * actors + held > total - 1:
        raise UserError(
            f"actor_cpus: {actors} engine actors x {cpus:g} CPUs"
            + (f" beside the {held:g} the other engine pools hold" if held else "")
            + f" leave none of the cluster's {total:g} CPUs for Ray Data's tasks; lower actor_cpus, "
            "or leave it unset (threads, no reservation)"
        )
    node = min((n["Resources"].get("CPU", 1.0) for n in ray.nodes() if n.get("Alive")), default=total)
    threads = int(cpus) if cpus else max(1, int(node // actors))  # as if the actors shared the smallest node
    remote = ray.remote(EngineHost).options(
        num_cpus=cpus or 0,
        num_gpus=gpus or None,
        max_restarts=RESTARTS,
        max_task_retries=RESTARTS,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
    )
    pools[key] = _Pool(key, [remote.remote(engine, threads, options) for _ in range(actors)])
    return pools[key].hosts


def drop_pool(key: tuple[Any, ...] | None = None, pools: dict[tuple[Any, ...], _Pool] | None = None) -> None:
    """Shut the run's host actors down: the pool of `key`, or every pool (the next
    `ray_pool` builds new ones)."""
    import ray

    pools = _pools() if pools is None else pools
    for k in [key] if key is not None else list(pools):
        pool = pools.pop(k, None)
        if pool is not None and ray.is_initialized() and k[0] == _session():  # an ended session's are gone
            for host in pool.hosts:
                ray.kill(host, no_restart=True)


def forward(batch: pa.Table, hosts: list[Any], policy: Policy, fn: Callable[..., pa.Table], job: Any) -> pa.Table:
    """A Ray Data task: hand each actor's rows (column ``_slot``) to that host, which
    plays them with ``fn(engine, rows, job)``; the results, concatenated."""
    import ray

    slots = batch["_slot"].to_pylist()
    parts = []
    for slot in sorted(set(slots)):
        rows = batch.filter(pa.array([s == slot for s in slots])).drop_columns(["_slot"])
        parts.append(hosts[slot].run.remote(policy, fn, rows, job))
    return pa.concat_tables(ray.get(parts))


def _beside(host: Any) -> dict[str, Any]:
    """Where the `forward` tasks run: on the node of the pool's first host, else anywhere
    (a label it must have, and an empty one to fall back to). A `forward` task only hands
    blocks on, but Ray Data spreads its tasks over every node, and a node that holds no
    CPUs (a cluster's head, as ``ray start --head --num-cpus=0`` is advised) keeps no idle
    worker: each eval or rollout there started a new worker process and imported this
    module first, 2.5-3 s a play on `bench/cluster.py`'s cluster."""
    node = patient(host.where.remote)["node"]
    return {"label_selector": {NODE_LABEL: node}, "fallback_strategy": [{"label_selector": {}}]}


def play_on_ray(
    items: pa.Table,
    policy: Policy,
    fn: Callable[..., pa.Table],
    job: Any,
    settings: EngineSettings,
    place: Callable[[str, int, dict[str, Any], int | None], None] | None = None,
) -> tuple[pa.Table, dict[str, float]]:
    """Map `items` (episode specs) over the session's host actors with Ray Data: an
    equal block per actor, played as ``fn(engine, rows, job)``; (the played table, the
    hosts' counters). `place` (`StageContext.place`) hears where each actor ran and how
    many of the items, in order, it played."""
    import ray
    import ray.data

    from stages.runtime import quiet

    quiet()
    if isinstance(policy, Weights):
        policy = policy.on_ray()
    actors = max(1, min(settings.actors, items.num_rows))
    hosts = ray_pool(settings.engine, actors, settings.actor_cpus, settings.actor_gpus, settings.options)
    pool = (_session(), settings.engine, actors, settings.actor_cpus, settings.actor_gpus, settings.options)
    size = -(-items.num_rows // actors)
    slots = pa.array([i // size for i in range(items.num_rows)], pa.int32())
    items = items.append_column("_slot", slots)
    blocks = [items.slice(i * size, size) for i in range(actors)]

    def play() -> tuple[pa.Table, list[dict[str, Any]], list[dict[str, float]]]:
        out = ray.data.from_arrow(blocks).map_batches(  # from_arrow waits on Ray tasks too
            forward,
            batch_format="pyarrow",
            batch_size=None,
            num_cpus=0,
            zero_copy_batch=True,
            **_beside(hosts[0]),
            fn_kwargs={"hosts": hosts, "policy": policy, "fn": fn, "job": job},
        )
        table = pa.concat_tables(ray.get(out.to_arrow_refs()))
        # where each host is, asked after the play: a restarted actor names its new node
        # (counters read twice, should the first answer be lost with a node, lose what the first reset: metrics)
        return table, [patient(h.where.remote) for h in hosts], [patient(h.counters.remote) for h in hosts]

    need = {"CPU": actors * (settings.actor_cpus or 0.0), "GPU": actors * settings.actor_gpus}
    try:
        table, places, counters = watched(play, need, f"{actors} engine actor(s)")
    except NodesLost:
        drop_pool(pool)
        raise
    except Exception as exc:  # a host that stayed dead: the next stage starts a new pool
        drop_pool(pool)
        raise RuntimeError(f"an engine actor failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    for i, where in enumerate(places if place is not None else []):
        place("actor", i, where, max(0, min(size, items.num_rows - i * size)))  # type: ignore[misc]
    counts: dict[str, float] = {}
    for c in counters:
        for k, v in c.items():
            counts[k] = counts.get(k, 0) + v
    return table, counts
