"""`pipeline show`: the checked DAG as text or as a Mermaid flowchart."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pipelines.graph.dag import Graph, Node, Wire
from pipelines.graph.plan import Step, plan, stored
from pipelines.graph.select import Selection, select
from pipelines.spec.build import Spec


def _ins(node: Node) -> str:
    def ref(w: Wire) -> str:
        if w.source.scope == "prev" or (w.source.scope == "once" and not node.once):
            return w.ref
        return w.dataset

    return ", ".join(ref(w) for w in node.wires) or "-"


def marks(steps: list[Step], wanted: list[bool], in_catalog: Callable[[str], bool]) -> dict[str, str]:
    """What `pipeline run` would do with each node's steps: how many it would run, how
    many it would take from the catalog, and whether a selection leaves it out; for a
    node whose results may stay in memory (the policy between checkpoints), how many
    of those it would run are stored whole (`pipelines.graph.plan.stored`)."""
    out: dict[str, str] = {}
    whole = stored(steps, wanted)
    for name in dict.fromkeys(s.node.name for s in steps):
        mine = [(s, w) for s, w in zip(steps, wanted, strict=True) if s.node.name == name]
        chosen = [s for s, w in mine if w]
        fresh = {s.key for s in chosen if s.reuses is None and not in_catalog(s.key)}
        cached = len({s.key for s in chosen if s.reuses is None}) - len(fresh)
        if not chosen:
            out[name] = "not selected"
        elif fresh:
            out[name] = f"would run {len(fresh)}" + (f", {cached} cached" if cached else "")
            if any(getattr(d, "resident", False) for d in chosen[0].node.stage.outputs.values()):
                out[name] += f" (stored whole: {len(fresh & whole)}, the rest kept in memory)"
        else:
            out[name] = f"cached ({cached})"
    return out


def would_run(spec: Spec, graph: Graph, root: str | None, selection: Selection) -> dict[str, str]:
    """`marks` of `spec`'s plan against the catalog at `root` (else the spec's; a
    catalog that does not exist yet holds nothing, so every selected step would run)."""
    from catalog.store import Catalog, existing_catalog
    from common.errors import UserError

    store: Catalog | None
    try:
        store = existing_catalog(root or spec.catalog.root)
    except UserError:
        store = None
    has: Callable[[str], bool] = store.has if store is not None else (lambda key: False)
    steps = plan(spec, graph, store)
    return marks(steps, select(steps, selection, has), has)


def render_text(graph: Graph, iterations: int, status: Mapping[str, str] | None = None) -> str:
    """One line a stage: name, [stage], inputs -> outputs, grouped by scope; with
    `status` (`marks`), what a run would do with it."""
    width = max(len(n.name) for n in graph.nodes)
    swidth = max(len(n.stage.name) for n in graph.nodes) + 2
    lines: list[str] = []
    for title, nodes in (("once", graph.once), (f"every iteration (x{iterations})", graph.iteration)):
        if not nodes:
            continue
        lines.append(f"{title}:")
        for n in nodes:
            every = f"  (every {n.every})" if n.every != 1 else ""
            outs = ", ".join(d for _, d in n.outputs)
            line = f"  {n.name:<{width}}  {'[' + n.stage.name + ']':<{swidth}}  {_ins(n)} -> {outs}{every}"
            lines.append(line if status is None else f"{line}  | {status.get(n.name, 'no step')}")
    return "\n".join(lines)


def render_mermaid(graph: Graph) -> str:
    """A Mermaid ``flowchart``: solid edges within an iteration, dotted edges for
    data carried to the next iteration (``@prev``)."""
    lines = ["flowchart TD"]
    for title, nodes in (("once", graph.once), ("iteration", graph.iteration)):
        if nodes:
            lines.append(f"  subgraph {title}")
            lines += [f'    {n.name}["{n.name}<br/><small>{n.stage.name}</small>"]' for n in nodes]
            lines.append("  end")
    for n in graph.nodes:
        for w in n.wires:
            if w.source.scope == "prev":
                later = "next iteration" if w.lag == 1 else f"{w.lag} iterations later"
                lines.append(f'  {w.source.node} -. "{w.dataset} ({later})" .-> {n.name}')
                if w.initial is not None:
                    lines.append(f'  {w.initial.node} -- "{w.dataset} (iteration 0)" --> {n.name}')
            else:
                lines.append(f'  {w.source.node} -- "{w.dataset}" --> {n.name}')
    return "\n".join(lines)
