"""The plan: every stage execution of a run, with its catalog key, before running.

Keys depend only on stage names, versions and code, configs, the run seed, the iteration
and the keys of the inputs (catalog.keys), never on what a stage computed, so the
whole run is known up front: the runner walks this list and skips every step whose
key the catalog already holds.

A stage with a `period` k (`stages.registry`; Online-k rollouts) is planned once
every k iterations; in between, the iteration's step is that same step again
(`reuses` names the iteration that runs it) and its table outputs are published
as the iteration's slice, ``<key>/<output>[j/k]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from catalog.datasets import Table
from catalog.keys import dataset_address, result_key
from catalog.store import Catalog
from common.config import ConfigProblem
from common.errors import SpecError
from pipelines.graph.dag import Graph, Node
from pipelines.spec.build import Spec


@dataclass(frozen=True)
class Step:
    """One stage execution: `inputs` maps each input to a dataset address."""

    iteration: int | None
    node: Node
    inputs: Mapping[str, str]
    key: str
    sources: tuple[str, ...] = ()  # stored datasets it reads besides its inputs (stage `sources`)
    reuses: int | None = None  # the earlier iteration whose step this is (period > 1)
    part: tuple[int, int] | None = None  # (j, k): the slice of its tables this iteration reads

    @property
    def label(self) -> str:
        return self.node.name if self.iteration is None else f"{self.iteration}:{self.node.name}"


def _step(
    spec: Spec,
    node: Node,
    iteration: int | None,
    scopes: dict[str, dict[str, str]],
    sources: tuple[str, ...],
    past: list[dict[str, str]] | None = None,
) -> Step:
    """`past[j]`: the datasets iteration j published (what ``@prev:k`` reads)."""
    inputs = {}
    for w in node.wires:
        name = w.source.node + "/" + w.source.output
        if w.source.scope == "prev" and iteration is not None and iteration >= w.lag:
            inputs[w.param] = (past or [])[iteration - w.lag][name]
            continue
        src = w.initial if w.source.scope == "prev" else w.source
        assert src is not None
        inputs[w.param] = scopes[src.scope][src.node + "/" + src.output]
    keyed = {**inputs, "@sources": ",".join(sources)} if sources else inputs
    key = result_key(node.stage.name, node.stage.version, node.config, keyed, spec.run.seed, iteration, node.stage.code)
    return Step(iteration, node, inputs, key, sources)


def _sources(spec: Spec, graph: Graph, catalog: Catalog | None) -> dict[str, tuple[str, ...]]:
    """Each node's stored sources, resolved against `catalog` (none without one)."""
    found: dict[str, tuple[str, ...]] = {}
    for node in graph.nodes:
        if node.stage.sources is None or catalog is None:
            continue
        try:
            found[node.name] = tuple(node.stage.sources(node.config, catalog))
        except ConfigProblem as problem:
            path = f"{node.section}.{problem.field}" if problem.field else node.section
            raise SpecError(spec.origins.where(path), path, problem.message) from None
    return found


def _publish(step: Step, scope: dict[str, str]) -> None:
    for out, _ in step.node.outputs:
        part = step.part if isinstance(step.node.stage.outputs[out], Table) else None
        scope[f"{step.node.name}/{out}"] = dataset_address(step.key, out, part)


def _period(node: Node) -> int:
    return node.stage.period(node.config) if node.stage.period is not None else 1


def plan(spec: Spec, graph: Graph, catalog: Catalog | None = None) -> list[Step]:
    """Every step of the run in execution order (`catalog` resolves stored sources)."""
    scopes: dict[str, dict[str, str]] = {"once": {}, "iteration": {}, "prev": {}}
    sources = _sources(spec, graph, catalog)
    steps: list[Step] = []
    for node in graph.once:
        steps.append(_step(spec, node, None, scopes, sources.get(node.name, ())))
        _publish(steps[-1], scopes["once"])
    first: dict[str, Step] = {}  # a periodic node's step of its current period
    past: list[dict[str, str]] = []  # each iteration's published datasets
    for i in range(spec.run.iterations):
        scopes["prev"], scopes["iteration"] = scopes["iteration"], {}
        if i:
            past.append(scopes["prev"])
        for node in graph.iteration:
            if i % node.every and i != spec.run.iterations - 1:  # sinks also see the final state
                continue
            k = _period(node)
            own = sources.get(node.name, ())
            if k == 1:
                step = _step(spec, node, i, scopes, own, past)
            elif i % k == 0:
                step = first[node.name] = replace(_step(spec, node, i, scopes, own, past), part=(0, k))
            else:
                base = first[node.name]
                step = replace(base, iteration=i, reuses=base.iteration, part=(i % k, k))
            steps.append(step)
            _publish(step, scopes["iteration"])
    return steps


def dependencies(steps: list[Step]) -> list[set[int]]:
    """For each step, the earlier steps it must wait for: those that produce the
    datasets it reads (an address is ``<key>/<output>[part]``), and for a step that
    reuses an earlier iteration's execution, that execution."""
    first: dict[str, int] = {}
    for n, s in enumerate(steps):
        first.setdefault(s.key, n)
    out: list[set[int]] = []
    for n, s in enumerate(steps):
        needs = {first[a.split("/", 1)[0]] for a in s.inputs.values() if a.split("/", 1)[0] in first}
        if s.reuses is not None:
            needs.add(first[s.key])
        out.append({d for d in needs if d != n})
    return out


def stored(steps: list[Step], wanted: list[bool]) -> set[str]:
    """The keys of the wanted steps whose resident outputs (``Artifact(resident=True)``,
    `stages.registry`) are committed whole: where their stage's `store` rule says so,
    at the last wanted step of their node, and wherever a wanted step reads them
    through an input that is not fed from memory (its stage's `in_memory`). The other
    resident outputs stay in the memory of the process that made them, under the same
    keys."""
    resident = [
        i
        for i, s in enumerate(steps)
        if wanted[i] and any(getattr(d, "resident", False) for d in s.node.stage.outputs.values())
    ]
    keys: set[str] = set()
    last: dict[str, int] = {}
    for i in resident:
        s = steps[i]
        last[s.node.name] = i
        rule = s.node.stage.store
        if rule is None or rule(s.node.config, s.iteration):
            keys.add(s.key)
    keys |= {steps[i].key for i in last.values()}
    made = {steps[i].key for i in resident}
    for i, s in enumerate(steps):
        if not wanted[i] or s.reuses is not None:
            continue
        for param, address in s.inputs.items():
            key = address.split("/", 1)[0]
            if key in made and param not in s.node.stage.memory_inputs(s.node.config):
                keys.add(key)
    return keys
