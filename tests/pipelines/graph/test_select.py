"""Running part of a pipeline: --to, --only, --from (`pipelines.graph.select`)."""

from __future__ import annotations

import pytest

from catalog.query import query
from common.errors import UserError
from pipelines.graph.dag import build_graph
from pipelines.graph.load import load_spec
from pipelines.graph.plan import plan
from pipelines.graph.select import Selection, select
from pipelines.graph.show import marks
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from tests.conftest import CALLS, TEST_PIPELINE, run_spec


def _run(path: str, catalog, overrides: tuple[str, ...] = (), **flags):
    return Runner(load_spec(path, overrides), catalog, Quiet(), selection=Selection.of(**flags)).run()


def test_to_runs_a_node_and_what_it_reads_from(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    summary = _run(path, catalog, to=["scale"])
    assert dict(CALLS) == {"source": 3, "scale": 3}
    assert (summary.ran, summary.left_out) == (6, 4)
    CALLS.clear()
    run_spec(path, catalog)  # the rest: what --to computed is cached
    assert dict(CALLS) == {"init": 1, "state": 3}


def test_only_needs_its_inputs_in_the_catalog(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    with pytest.raises(UserError, match=r"--only state: step 0:state reads from init \(t_init-.*not in the catalog"):
        _run(path, catalog, only=["state"])
    assert not CALLS and not catalog.result_keys()  # nothing ran
    _run(path, catalog, to=["init"])
    with pytest.raises(UserError, match=r"reads from 0:scale .*--to scale"):
        _run(path, catalog, only=["state"])
    _run(path, catalog, to=["scale"])
    CALLS.clear()
    _run(path, catalog, only=["state"])
    assert dict(CALLS) == {"state": 3}


def test_only_again_with_another_setting_keeps_the_rest_of_the_run_in_its_views(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    CALLS.clear()
    _run(path, catalog, ("scale.factor=5",), only=["scale"])
    assert dict(CALLS) == {"scale": 3}
    numbers = query(catalog, "select run, count(*) n from t_numbers group by 1").to_pylist()
    assert numbers == [{"run": "spec", "n": 12}]  # the cached sources are still the run's
    total = query(catalog, "select sum(value) from t_scaled").column(0).to_pylist()[0]
    assert total == pytest.approx(5.0 * sum(it * 100 + i for it in range(3) for i in range(4)))


def test_from_runs_a_node_and_what_reads_from_it(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    with pytest.raises(UserError, match=r"--from scale: step 0:scale reads from 0:source"):
        _run(path, catalog, start=["scale"])
    run_spec(path, catalog)
    CALLS.clear()
    _run(path, catalog, ("scale.factor=4",), start=["scale"])
    assert dict(CALLS) == {"scale": 3, "state": 3}


def test_unknown_node_names_the_nearest(spec_file, catalog):
    with pytest.raises(UserError, match=r"--to scal: no such node .*did you mean 'scale'"):
        _run(spec_file(TEST_PIPELINE), catalog, to=["scal"])


def test_show_marks_what_would_run(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    _run(path, catalog, to=["source"])
    spec = load_spec(path)
    steps = plan(spec, build_graph(spec), catalog)
    got = marks(steps, select(steps, Selection.of(to=["scale"]), catalog.has), catalog.has)
    assert got == {"init": "not selected", "source": "cached (3)", "scale": "would run 3", "state": "not selected"}
    everything = marks(steps, select(steps, Selection(), catalog.has), catalog.has)
    assert everything["init"] == "would run 1" and everything["source"] == "cached (3)"
