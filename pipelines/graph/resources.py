"""A run's resource plan: the GPUs and reserved CPUs its stages hold at once, checked
against the cluster before anything runs.

Each stage says what a step holds (`stages.registry.Claim`): the engine actors hold
their share of a GPU for the session, a worker group kept for the run holds its GPUs
for the run, a Ray Train fit holds its workers while its step runs. Ray waits without
end for a request no node can meet, so a plan that does not fit is refused in one
line, naming the holders and the settings to change, at the start of `pipeline run`
(and at `pipeline validate` where a cluster address is known).

At once means: every holder of the run at the same time (each engine pool once: the
stages of the same engine settings share it), plus the largest holders of a step, as
many as steps may run at once (``run.concurrency``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import UserError
from stages.registry import Claim

#: the settings a plan that does not fit points at
_LEVERS = (
    "rollout.actor_gpus / eval.actor_gpus (a fraction shares a GPU), "
    "update.optim.workers and update.optim.gpus, critic.optim.workers (0: the critic trains in this process)"
)


@dataclass(frozen=True)
class Plan:
    """The holders of a run and what they hold at once."""

    held: tuple[Claim, ...] = ()  # for the run
    stepwise: tuple[Claim, ...] = ()  # the largest step holders that may run at once
    concurrency: int = 1
    notes: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> float:
        return sum(c.gpus for c in self.held) + sum(c.gpus for c in self.stepwise)

    @property
    def cpus(self) -> float:
        return sum(c.cpus for c in self.held) + sum(c.cpus for c in self.stepwise)

    def holders(self) -> str:
        """The holders with their shares, for a message: "2 engine actor(s) 1 GPU, update 1 GPU"."""
        parts = [
            f"{c.holder} {_num(c.gpus)} GPU" + (f" {_num(c.cpus)} CPU" if c.cpus else "")
            for c in (*self.held, *self.stepwise)
            if c.gpus or c.cpus
        ]
        return ", ".join(parts) or "nothing reserved"

    def describe(self) -> str:
        """One line: what the run holds at once."""
        if not self.gpus and not self.cpus:
            return "resources: no GPU; nothing reserved beyond Ray's defaults"
        return f"resources: {_num(self.gpus)} GPU and {_num(self.cpus)} reserved CPU at once ({self.holders()})"


def _num(x: float) -> str:
    return f"{x:g}"


def plan(claims: Iterable[Claim], concurrency: int = 1) -> Plan:
    """The plan of a run whose steps claim `claims` (every node's, once each)."""
    pools: dict[str, Claim] = {}
    held: list[Claim] = []
    steps: list[Claim] = []
    for c in claims:
        if c.pool:
            best = pools.get(c.pool)
            if best is None or (c.gpus, c.cpus) > (best.gpus, best.cpus):
                pools[c.pool] = c
        elif c.span == "run":
            held.append(c)
        else:
            steps.append(c)
    steps.sort(key=lambda c: (c.gpus, c.cpus), reverse=True)
    return Plan(tuple(pools.values()) + tuple(held), tuple(steps[: max(1, concurrency)]), concurrency)


def of_nodes(nodes: Iterable[object], concurrency: int = 1) -> Plan:
    """The plan of graph nodes (`pipelines.graph.dag.Node`): each node's claims once."""
    claims: list[Claim] = []
    for node in nodes:
        claims += node.stage.claims_of(node.config)  # type: ignore[attr-defined]
    return plan(claims, concurrency)


def of_spec(spec: Any) -> Plan:
    """The plan of a whole spec (every node of its graph), as `pipeline validate` shows it."""
    from pipelines.graph.dag import build_graph

    return of_nodes(build_graph(spec).nodes, spec.run.concurrency)


def check(p: Plan, available: Mapping[str, float], where: str) -> None:
    """Raise a one-line `UserError` when the plan holds more than `available` (Ray's
    ``cluster_resources()``: ``GPU`` and ``CPU``) at once. `where` names the cluster."""
    gpus, cpus = float(available.get("GPU", 0.0)), float(available.get("CPU", 0.0))
    short = []
    if p.gpus > gpus + 1e-9:
        short.append(f"{_num(p.gpus)} GPU at once and {where} has {_num(gpus)}")
    if p.cpus > cpus + 1e-9:
        short.append(f"{_num(p.cpus)} reserved CPU at once and {where} has {_num(cpus)}")
    if short:
        raise UserError(
            f"the run's resource plan does not fit: it needs {' and '.join(short)} ({p.holders()}); "
            f"Ray would wait for them without end. Change {_LEVERS}"
        )
