"""Lifecycle hooks: a user's hook sees every point of a run, in order."""

from __future__ import annotations

import pytest

import tests.pipelines.run.test_watch  # noqa: F401  (registers the stage t.signal)
from common.errors import StageFailed
from pipelines.graph.load import load_spec
from pipelines.run.hooks import Hooks
from pipelines.run.runner import Runner
from tests.conftest import FAIL, TEST_PIPELINE


class Recorder(Hooks):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def before_run(self, start):
        self.calls.append(("before_run", start.run, start.steps, start.settings.get("scale", {}).get("factor")))

    def before_step(self, step):
        self.calls.append(("before_step", step.node, step.iteration))

    def after_step(self, event):
        self.calls.append(("after_step", event.node, event.iteration, event.status))

    def after_iteration(self, iteration, metrics, latest):
        self.calls.append(("after_iteration", iteration, sorted(metrics)))

    def on_warning(self, event):
        self.calls.append(("on_warning", event.iteration, event.rule))

    def on_error(self, error):
        self.calls.append(("on_error", type(error).__name__))

    def after_run(self, end):
        self.calls.append(("after_run", end.status, end.message.split(":")[0]))


def _run(spec_file, catalog, text=TEST_PIPELINE):
    hook = Recorder()
    Runner(load_spec(spec_file(text)), catalog, hooks=[hook]).run()
    return hook.calls


def test_a_hook_sees_the_run_its_steps_and_iterations_in_order(spec_file, catalog):
    calls = _run(spec_file, catalog)
    assert calls[0] == ("before_run", "spec", 10, 3)
    assert calls[1:3] == [("before_step", "init", None), ("after_step", "init", None, "ran")]
    iteration_0 = calls[3:10]
    assert [c[:2] for c in iteration_0] == [
        ("before_step", "source"),
        ("after_step", "source"),
        ("before_step", "scale"),
        ("after_step", "scale"),
        ("before_step", "state"),
        ("after_step", "state"),
        ("after_iteration", 0),
    ]
    assert "perf/seconds" in iteration_0[-1][2]
    assert [c[1] for c in calls if c[0] == "after_iteration"] == [0, 1, 2]
    assert calls[-1] == ("after_run", "finished", "")
    again = _run(spec_file, catalog)  # fully cached: the same points, every step cached
    assert {c[3] for c in again if c[0] == "after_step"} == {"cached"}


def test_a_hook_hears_of_warnings(spec_file, catalog):
    calls = _run(spec_file, catalog, "run: {iterations: 6}\npipeline:\n  s: {stage: t.signal}\n")
    assert ("on_warning", 4, "entropy_drop") in calls
    after_4 = next(i for i, c in enumerate(calls) if c[:2] == ("after_iteration", 4))
    # the warnings hook runs before the user's: the warning arrives as iteration 4 ends, before its after_iteration
    assert calls.index(("on_warning", 4, "entropy_drop")) == after_4 - 1


def test_a_failed_run_calls_on_error_then_after_run(spec_file, catalog):
    FAIL.add("scale")
    hook = Recorder()
    with pytest.raises(StageFailed):
        Runner(load_spec(spec_file(TEST_PIPELINE)), catalog, hooks=[hook]).run()
    assert hook.calls[-2:] == [("on_error", "StageFailed"), ("after_run", "failed", "StageFailed")]
