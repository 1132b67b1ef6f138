"""`pipeline show`: the checked DAG as text or as a Mermaid flowchart."""

from __future__ import annotations

from pipelines.dag import Graph, Node, Wire


def _ins(node: Node) -> str:
    def ref(w: Wire) -> str:
        if w.source.scope == "prev" or (w.source.scope == "once" and not node.once):
            return f"{w.dataset}@{w.source.scope}"
        return w.dataset

    return ", ".join(ref(w) for w in node.wires) or "-"


def render_text(graph: Graph, iterations: int) -> str:
    """One line a stage: name, [stage], inputs -> outputs, grouped by scope."""
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
            lines.append(f"  {n.name:<{width}}  {'[' + n.stage.name + ']':<{swidth}}  {_ins(n)} -> {outs}{every}")
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
                lines.append(f'  {w.source.node} -. "{w.dataset} (next iteration)" .-> {n.name}')
                if w.initial is not None:
                    lines.append(f'  {w.initial.node} -- "{w.dataset} (iteration 0)" --> {n.name}')
            else:
                lines.append(f'  {w.source.node} -- "{w.dataset}" --> {n.name}')
    return "\n".join(lines)
