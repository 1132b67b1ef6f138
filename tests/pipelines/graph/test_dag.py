"""The graph: scopes, @prev wiring, topological order and rendering."""

from __future__ import annotations

from pipelines.graph.dag import build_graph
from pipelines.graph.load import load_spec
from pipelines.graph.plan import plan
from pipelines.graph.show import render_mermaid, render_text
from tests.conftest import TEST_PIPELINE


def test_scopes_and_prev_wiring(spec_file):
    graph = build_graph(load_spec(spec_file(TEST_PIPELINE)))
    assert [n.name for n in graph.once] == ["init"]
    assert [n.name for n in graph.iteration] == ["source", "scale", "state"]
    state = graph.iteration[2]
    wires = {w.param: w for w in state.wires}
    assert wires["state"].source.scope == "prev" and wires["state"].source.node == "state"
    assert wires["state"].initial.node == "init"
    assert wires["scaled"].source.scope == "iteration"


def test_topological_order_ignores_declaration_order(spec_file):
    text = """
    run: {iterations: 1}
    pipeline:
      scale: {stage: t.scale}
      source: {stage: t.source}
    """
    graph = build_graph(load_spec(spec_file(text)))
    assert [n.name for n in graph.iteration] == ["source", "scale"]


def test_plan_resolves_prev_to_the_previous_iteration(spec_file):
    spec = load_spec(spec_file(TEST_PIPELINE))
    steps = plan(spec, build_graph(spec))
    assert [s.label for s in steps][:4] == ["init", "0:source", "0:scale", "0:state"]
    assert len(steps) == 1 + 3 * 3
    by_label = {s.label: s for s in steps}
    assert by_label["0:state"].inputs["state"] == f"{by_label['init'].key}/state"
    assert by_label["1:state"].inputs["state"] == f"{by_label['0:state'].key}/state"
    assert by_label["2:scale"].inputs["numbers"] == f"{by_label['2:source'].key}/numbers"
    assert len({s.key for s in steps}) == len(steps)


def test_every_n_runs_on_multiples_and_the_last(spec_file):
    probe = "  probe: {stage: t.source, every: 2, outputs: {numbers: probe_numbers}}\n"
    text = TEST_PIPELINE.replace("  state: {stage: t.state}\n", "  state: {stage: t.state}\n" + probe)
    for iterations, expected in ((5, [0, 2, 4]), (6, [0, 2, 4, 5])):
        spec = load_spec(spec_file(text), [f"run.iterations={iterations}"])
        assert [s.iteration for s in plan(spec, build_graph(spec)) if s.node.name == "probe"] == expected


def test_render_text_and_mermaid(spec_file):
    graph = build_graph(load_spec(spec_file(TEST_PIPELINE)))
    text = render_text(graph, 3)
    assert "once:" in text and "every iteration (x3):" in text
    assert "state@prev" in text and "[t.scale]" in text
    mermaid = render_mermaid(graph)
    assert mermaid.startswith("flowchart TD")
    assert 'state -. "state (next iteration)" .-> state' in mermaid
    assert 'init -- "state (iteration 0)" --> state' in mermaid
    assert 'source -- "numbers" --> scale' in mermaid


def test_prev_k_reads_k_iterations_back(spec_file):
    import pytest

    from common.errors import SpecError

    lagged = TEST_PIPELINE.replace("state: {stage: t.state}", "state: {stage: t.state, inputs: {state: state@prev:2}}")
    spec = load_spec(spec_file(lagged))
    graph = build_graph(spec)
    by_label = {s.label: s for s in plan(spec, graph)}
    assert by_label["0:state"].inputs["state"] == f"{by_label['init'].key}/state"
    assert by_label["1:state"].inputs["state"] == f"{by_label['init'].key}/state"  # two back is before the start
    assert by_label["2:state"].inputs["state"] == f"{by_label['0:state'].key}/state"
    assert "state@prev:2" in render_text(graph, 3) and "2 iterations later" in render_mermaid(graph)
    for bad in ("state@prev:0", "state@prev:x", "state@once:2", "state@prev:65"):
        with pytest.raises(SpecError, match=r"expected 'dataset', 'dataset@prev', 'dataset@prev:k'"):
            load_spec(
                spec_file(
                    TEST_PIPELINE.replace(
                        "state: {stage: t.state}", f"state: {{stage: t.state, inputs: {{state: '{bad}'}}}}"
                    )
                )
            )
