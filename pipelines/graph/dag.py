"""The DAG: a spec's nodes wired through named datasets, checked before anything runs.

Scopes: once-stages run before the iterations and see only each other's outputs.
Stages of an iteration see the iteration's outputs and the once-stages' outputs
(a name produced in both scopes means the iteration's). ``name@prev`` reads the
previous iteration's ``name``, and at iteration 0 the once-stage output of that
name: this is how the policy flows from one iteration's update to the next
iteration's rollout, with the warm start as the first policy. ``name@prev:k`` reads
``name`` from k iterations back (the once-stage output while fewer than k
iterations have run): a rollout wired ``policy@prev:2`` samples with a policy one
update staler than the update it feeds trains (bounded staleness; the update
corrects for it with ``update.correction: decoupled``). ``name@once`` reads
the once-stage output even where the iteration produces the same name (the frozen
reference policy of a KL term). An optional input whose default dataset nobody
produces is left unwired.

After wiring, each stage's cross-node `check` runs (`stages.registry`): a
`ConfigProblem` it raises becomes a spec error at ``<node>.<field>``.

`build_graph` rejects unknown inputs and outputs, missing and duplicate datasets,
kind mismatches (table vs artifact), consumers of every-N sinks, and cycles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from common.config import ConfigProblem
from common.errors import SpecError
from pipelines.spec import typed
from pipelines.spec.build import NodeSpec, Spec
from stages.registry import StageDef, output_ref_type

Scope = Literal["once", "iteration", "prev"]


@dataclass(frozen=True)
class Source:
    """Where an input comes from: output `output` of node `node` in `scope`."""

    node: str
    output: str
    scope: Scope


@dataclass(frozen=True)
class Wire:
    """One input of a node. For ``@prev`` inputs, `initial` is what the iterations
    before the `lag`-th read (iteration 0 for plain ``@prev``)."""

    param: str
    dataset: str
    source: Source
    initial: Source | None = None
    lag: int = 1  # ``@prev:k``: k iterations back

    @property
    def ref(self) -> str:
        """The wiring as written: ``dataset``, ``dataset@prev``, ``dataset@prev:2``, ``dataset@once``."""
        if self.source.scope == "prev":
            return f"{self.dataset}@prev" + (f":{self.lag}" if self.lag != 1 else "")
        return self.dataset if self.source.scope == "iteration" else f"{self.dataset}@{self.source.scope}"


@dataclass(frozen=True)
class Node:
    """A node of the checked graph."""

    name: str
    stage: StageDef
    once: bool
    every: int
    config: Any
    wires: tuple[Wire, ...]
    outputs: tuple[tuple[str, str], ...]  # (stage output, dataset name)
    section: str = ""  # the spec section of its config


@dataclass(frozen=True)
class Graph:
    """Once-stages and iteration stages, each in a topological order."""

    once: tuple[Node, ...]
    iteration: tuple[Node, ...]

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.once + self.iteration


def _outputs(spec: Spec, n: NodeSpec) -> tuple[tuple[str, str], ...]:
    path = f"pipeline.{n.name}.outputs"
    for out in n.outputs:
        if out not in n.stage.outputs:
            raise SpecError(
                spec.origins.where(f"{path}.{out}"),
                f"{path}.{out}",
                f"stage '{n.stage.name}' has no output '{out}'{typed.did_you_mean(out, n.stage.outputs)}",
            )
    return tuple((out, n.outputs.get(out, out)) for out in n.stage.outputs)


def _producers(spec: Spec, nodes: list[NodeSpec], outs: dict[str, tuple]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for n in nodes:
        for out, dataset in outs[n.name]:
            if dataset in found:
                path = f"pipeline.{n.name}.outputs"
                raise SpecError(
                    spec.origins.where(path),
                    path,
                    f"dataset '{dataset}' is already produced by '{found[dataset][0]}' in the same scope",
                )
            found[dataset] = (n.name, out)
    return found


Producers = dict[str, tuple[str, str]]  # dataset -> (node, output)


def _wire(spec: Spec, n: NodeSpec, param: str, ref: str, once_p: Producers, iter_p: Producers) -> Wire:
    path = f"pipeline.{n.name}.inputs.{param}"
    where = spec.origins.where(path)
    dataset, _, suffix = ref.partition("@")
    suffix, _, k = suffix.partition(":")
    lag = int(k) if k.isdigit() and suffix == "prev" else 1
    if suffix not in ("", "prev", "once") or (k and (suffix != "prev" or not k.isdigit() or not 1 <= lag <= 64)):
        raise SpecError(
            where,
            path,
            f"'{ref}': expected 'dataset', 'dataset@prev', 'dataset@prev:k' (1 <= k <= 64) or 'dataset@once'",
        )
    if suffix == "once":
        if dataset not in once_p:
            raise SpecError(where, path, f"'{ref}': no once-stage produces '{dataset}'")
        return Wire(param, dataset, Source(*once_p[dataset], "once"))
    if suffix == "prev":
        if n.once:
            raise SpecError(where, path, f"'{ref}': a once-stage has no previous iteration")
        if dataset not in iter_p:
            raise SpecError(where, path, f"'{ref}': no stage of the iteration produces '{dataset}'")
        if dataset not in once_p:
            raise SpecError(
                where, path, f"'{ref}' has no value at iteration 0: add a once-stage that outputs '{dataset}'"
            )
        return Wire(param, dataset, Source(*iter_p[dataset], "prev"), Source(*once_p[dataset], "once"), lag)
    if not n.once and dataset in iter_p:
        return Wire(param, dataset, Source(*iter_p[dataset], "iteration"))
    if dataset in once_p:
        return Wire(param, dataset, Source(*once_p[dataset], "once"))
    known = set(once_p) | (set() if n.once else set(iter_p))
    raise SpecError(where, path, f"no stage produces dataset '{dataset}'{typed.did_you_mean(dataset, known)}")


def _check_kinds(
    spec: Spec, n: NodeSpec, wires: list[Wire], stages: dict[str, StageDef], every: dict[str, int]
) -> None:
    for w in wires:
        path = f"pipeline.{n.name}.inputs.{w.param}"
        for src in filter(None, (w.source, w.initial)):
            produced = output_ref_type(stages[src.node].outputs[src.output])
            wanted = n.stage.inputs[w.param]
            if produced is not wanted:
                raise SpecError(
                    spec.origins.where(path),
                    path,
                    f"'{w.dataset}' is {produced.__name__[:-3].lower()} from '{src.node}', "
                    f"but '{n.stage.name}' expects {wanted.__name__[:-3].lower()} for '{w.param}'",
                )
            if every[src.node] != 1:
                message = (
                    f"'{src.node}' runs only every {every[src.node]} iterations (pipeline.{src.node}.every); "
                    "nothing may consume its outputs"
                )
                raise SpecError(spec.origins.blame(path, message), path, message)


def _cycle(deps: dict[str, set[str]], stuck: list[str]) -> list[str]:
    """One cycle among `stuck` (nodes none of whose order can be settled): each reads
    from the next, in the order they are wired, the first one taken from the spec's order."""
    left = set(stuck)
    path: list[str] = []
    node = stuck[0]
    while node not in path:
        path.append(node)
        node = next(d for d in stuck if d in deps[node] and d in left)  # every stuck node waits on one
    return path[path.index(node) :][::-1]


def _toposort(spec: Spec, nodes: list[Node]) -> tuple[Node, ...]:
    """Kahn's algorithm over same-scope edges; ties keep the spec's order."""
    names = {n.name for n in nodes}
    deps = {
        n.name: {w.source.node for w in n.wires if w.source.scope != "prev" and w.source.node in names} for n in nodes
    }
    order: list[Node] = []
    remaining = list(nodes)
    while remaining:
        ready = [n for n in remaining if not deps[n.name] - {o.name for o in order}]
        if not ready:
            cycle = _cycle(deps, [n.name for n in remaining])
            at = spec.origins.latest([f"pipeline.{n}" for n in cycle])  # the wiring set last closed it
            raise SpecError(
                spec.origins.where(at),
                at,
                f"the stages form a cycle ({' -> '.join([*cycle, cycle[0]])}); use 'dataset@prev' to read the "
                "previous iteration",
            )
        order.append(ready[0])
        remaining.remove(ready[0])
    return tuple(order)


def build_graph(spec: Spec) -> Graph:
    """Resolve and check the wiring of `spec` (see the module docstring)."""
    outs = {n.name: _outputs(spec, n) for n in spec.nodes}
    once_nodes = [n for n in spec.nodes if n.once]
    iter_nodes = [n for n in spec.nodes if not n.once]
    once_p = _producers(spec, once_nodes, outs)
    iter_p = _producers(spec, iter_nodes, outs)
    stages = {n.name: n.stage for n in spec.nodes}
    every = {n.name: n.every for n in spec.nodes}
    built: list[Node] = []
    for n in spec.nodes:
        for param in n.inputs:
            if param not in n.stage.inputs:
                path = f"pipeline.{n.name}.inputs.{param}"
                raise SpecError(
                    spec.origins.where(path),
                    path,
                    f"stage '{n.stage.name}' has no input '{param}'{typed.did_you_mean(param, n.stage.inputs)}",
                )
        wires = []
        for p in n.stage.inputs:
            try:
                wires.append(_wire(spec, n, p, n.inputs.get(p, n.stage.wiring.get(p, p)), once_p, iter_p))
            except SpecError:
                if p in n.inputs or p not in n.stage.optional:
                    raise
        _check_kinds(spec, n, wires, stages, every)
        built.append(Node(n.name, n.stage, n.once, n.every, n.config, tuple(wires), outs[n.name], n.section or n.name))
    _run_checks(spec, built)
    once = _toposort(spec, [b for b in built if b.once])
    iteration = _toposort(spec, [b for b in built if not b.once])
    return Graph(once=once, iteration=iteration)


class _Neighbours:
    """The `stages.registry.Neighbours` view of one node."""

    def __init__(self, node: Node, nodes: dict[str, Node]) -> None:
        self.node, self.nodes = node, nodes

    def upstream(self, stage: str) -> Any | None:
        seen, queue = {self.node.name}, [self.node]
        while queue:
            current = queue.pop(0)
            for w in current.wires:
                for src in filter(None, (w.source, w.initial)):
                    if src.node in seen:
                        continue
                    seen.add(src.node)
                    found = self.nodes[src.node]
                    if found.stage.name == stage:
                        return found.config
                    queue.append(found)
        return None

    def configs(self, stage: str) -> list[Any]:
        return [n.config for n in self.nodes.values() if n.stage.name == stage]

    def wired(self, param: str) -> bool:
        return any(w.param == param for w in self.node.wires)


def _run_checks(spec: Spec, built: list[Node]) -> None:
    nodes = {n.name: n for n in built}
    for n in built:
        if n.stage.check is None:
            continue
        try:
            n.stage.check(n.config, _Neighbours(n, nodes))
        except ConfigProblem as problem:
            raise _at_node(spec, n, problem) from None


def _at_node(spec: Spec, node: Node, problem: ConfigProblem) -> SpecError:
    """A check's problem as a spec error at its key (``<section>.<field>``, or the node
    itself, ``pipeline.<node>``), blamed on the source that set it last."""
    path = f"{node.section}.{problem.field}" if problem.field else f"pipeline.{node.name}"
    return SpecError(spec.origins.blame(path, problem.message), path, problem.message)


def preflight(spec: Spec, steps: list[Any], cached: Callable[[str], bool]) -> None:
    """The stages' `preflight` checks (those that read files, e.g. a model's tokenizer),
    once for every node with a step in `steps` that the catalog does not hold: run when a
    run starts, before any step computes. A problem is a `SpecError` at the node's key."""
    done: set[str] = set()
    for step in steps:
        node = step.node
        if node.stage.preflight is None or node.name in done or cached(step.key):
            continue
        done.add(node.name)
        try:
            node.stage.preflight(node.config)
        except ConfigProblem as problem:
            raise _at_node(spec, node, problem) from None
