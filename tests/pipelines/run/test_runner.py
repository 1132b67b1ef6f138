"""Cache semantics, resume after a failure, and run records."""

from __future__ import annotations

import os
import signal
import sys
import time

import pyarrow as pa
import pytest

from catalog.datasets import Table
from catalog.query import query
from catalog.store import Catalog
from common.errors import Interrupted, StageFailed
from pipelines.graph.load import load_spec
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from stages.registry import StageContext, StageResult, stage
from tests.conftest import CALLS, FAIL, TEST_PIPELINE, SourceConfig, run_spec


def test_second_run_executes_nothing(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    first, _ = run_spec(path, catalog)
    assert (first.ran, first.cached) == (10, 0)
    CALLS.clear()
    second, display = run_spec(path, catalog)
    assert (second.ran, second.cached) == (0, 10)
    assert sum(CALLS.values()) == 0
    assert {e.status for e in display.events} == {"cached"}


def test_changing_one_config_reruns_exactly_downstream(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    CALLS.clear()
    _summary, display = run_spec(path, catalog, ("scale.factor=5",))
    ran = sorted(e.label for e in display.events if e.status == "ran")
    # scale changes every iteration; state depends on scale (and on its own past);
    # init and source do not depend on scale.
    assert ran == sorted(f"{i}:{n}" for i in range(3) for n in ("scale", "state"))
    assert CALLS == {"scale": 3, "state": 3}


def test_change_in_last_iteration_only_touches_the_tail(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    summary, _ = run_spec(path, catalog, ("run.iterations=4",))
    assert (summary.ran, summary.cached) == (3, 10)


def test_key_false_field_does_not_rerun(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    summary, _ = run_spec(path, catalog, ("source.note=cosmetic",))
    assert summary.ran == 0


def test_failure_mid_write_commits_nothing_and_rerun_resumes(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    FAIL.add("scale")
    with pytest.raises(StageFailed, match=r"stage 'scale' \(iteration 0\) failed: RuntimeError: injected failure"):
        run_spec(path, catalog)
    keys = catalog.result_keys()
    assert sorted(k.split("-")[0] for k in keys) == ["t_init", "t_source"]
    staging = catalog.root.path("_staging")
    assert not os.path.isdir(staging) or os.listdir(staging) == []
    runs = query(catalog, "select status, error from runs").to_pylist()
    assert runs[0]["status"] == "failed" and "injected failure" in runs[0]["error"]
    FAIL.clear()
    CALLS.clear()
    summary, _ = run_spec(path, catalog)
    assert (summary.ran, summary.cached) == (8, 2)
    assert CALLS["init"] == 0 and CALLS["source"] == 2  # iteration 0 was committed
    assert query(catalog, "select status from runs").to_pylist() == [{"status": "finished"}]


def test_an_interrupt_before_the_stage_starts_leaves_nothing_staged(spec_file, catalog, monkeypatch):
    """A signal that lands after a step's staging folder is made and before its stage
    function runs (while its context is built) still drops what was staged."""
    from pipelines.run import steps

    def interrupted(*args: object, **kwargs: object) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(steps, "StageContext", interrupted)
    with pytest.raises(Interrupted):
        run_spec(spec_file(TEST_PIPELINE), catalog)
    staging = catalog.root.path("_staging")
    assert not os.path.isdir(staging) or os.listdir(staging) == []


def test_a_crash_leaves_only_untrusted_staging(spec_file, catalog):
    """A process killed mid-write leaves a folder under _staging and no manifest:
    the result is not committed, and a re-run writes it again."""
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    victim = next(k for k in catalog.result_keys() if k.startswith("t_scale"))
    os.rename(catalog.root.path("results", victim), catalog.root.path("_staging", victim + ".dead"))
    assert not catalog.has(victim)
    summary, _ = run_spec(path, catalog)
    assert summary.ran >= 1 and catalog.has(victim)


def test_state_flows_through_prev(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    counts = query(catalog, "select iteration, value from metrics where name = 'actor/count' order by iteration")
    assert counts.to_pylist() == [{"iteration": i, "value": float(i + 1)} for i in range(3)]


def test_ray_is_started_only_on_demand(spec_file, catalog, no_ray, tmp_path, monkeypatch):
    """A run starts Ray where a stage needs it and shuts it down at its end; with
    ``PIPELINE_KEEP_RAY=1`` the session stays up and the next run in the process uses it
    instead of starting its own, and what a run held in it (`common.live`) still ends with
    the run; a run that did not start the session (``keep_ray=False``, the command line's)
    leaves it alone."""
    import ray

    from common import live
    from pipelines.run.session import KEEP_RAY

    text = "run: {iterations: 1}\npipeline:\n  r: {stage: t.ray}\n"
    summary, _ = run_spec(spec_file(text), catalog)
    assert summary.ran == 1 and not ray.is_initialized()
    values = catalog.ref(catalog.result_keys()[0], "numbers").read()["value"].to_pylist()
    assert sorted(values) == [0, 2, 4, 6, 8, 10, 12, 14]

    monkeypatch.setenv(KEEP_RAY, "1")
    spec = load_spec(spec_file(text))

    def run(n: int, keep: bool | None = None) -> None:
        assert Runner(spec, Catalog(str(tmp_path / f"catalog{n}")), Quiet(), keep_ray=keep).run().ran == 1

    run(1)
    assert ray.is_initialized() and live.held() == {}
    session = ray.get_runtime_context().get_node_id()
    run(2)
    assert ray.get_runtime_context().get_node_id() == session
    run(3, keep=False)
    assert ray.is_initialized(), "a session the run did not start is not the run's to end"
    ray.shutdown()


def test_a_periodic_stage_runs_once_per_period_and_each_iteration_reads_its_slice(spec_file, catalog):
    path = spec_file(TEST_PIPELINE.replace("iterations: 3", "iterations: 5").replace("n: 4", "n: 4, period: 2"))
    _summary, display = run_spec(path, catalog)
    status = {e.label: e.status for e in display.events if e.node == "source"}
    assert status == {
        "0:source": "ran",
        "1:source": "reused",
        "2:source": "ran",
        "3:source": "reused",
        "4:source": "ran",
    }
    assert CALLS["source"] == 3 and CALLS["scale"] == 5
    totals = query(catalog, "select iteration, value from metrics where name = 'adv/total' order by iteration")
    assert totals.to_pylist() == [{"iteration": i, "value": 3.0 * (400 * i + 6)} for i in range(5)]
    steps = query(catalog, "select iteration, status from steps where node = 'source' order by 1").to_pylist()
    assert [s["status"] for s in steps] == ["ran", "reused", "ran", "reused", "ran"]
    CALLS.clear()
    again, _ = run_spec(path, catalog)
    assert again.ran == 0 and sum(CALLS.values()) == 0


def test_sigterm_while_ray_starts_is_an_interrupt(spec_file, catalog, monkeypatch):
    """Ray's own SIGTERM handler, installed while it starts, exits with SystemExit(15)."""
    import signal

    from typer.testing import CliRunner

    import pipelines.run.session
    from catalog.query import query
    from pipelines.cli.main import app

    def dies(*args, **kwargs):
        raise SystemExit(signal.SIGTERM)

    monkeypatch.setattr(pipelines.run.session, "start_ray", dies)
    path = spec_file("run: {iterations: 1}\npipeline:\n  r: {stage: t.ray}\n")
    result = CliRunner().invoke(app, ["run", path, "--catalog", catalog.root.uri])
    assert result.exit_code == 143 and result.stderr.strip().splitlines()[-1].startswith("error: interrupted at")
    assert query(catalog, "select status from runs").column(0).to_pylist() == ["interrupted"]


def test_a_local_ray_starts_its_workers_at_the_drivers_priority(monkeypatch):
    import ray

    from pipelines.run.session import WORKER_NICENESS, start_ray

    seen = []
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append((os.environ.get(WORKER_NICENESS), kw.get("address"))))
    monkeypatch.delenv(WORKER_NICENESS, raising=False)
    start_ray(None)
    # Ray's default, 15, left the engine actor the CPU no one else wanted; "local": a Ray of its own, not
    # a cluster some `ray start` left running on the machine (Ray joins that one when no address is given)
    assert seen[-1] == ("0", "local")
    monkeypatch.setenv(WORKER_NICENESS, "15")
    start_ray(None)
    assert seen[-1] == ("15", "local")  # a user's setting stands
    start_ray("10.0.0.1:6379")
    assert seen[-1][1] == "10.0.0.1:6379"


class _SignalInDel:
    """Sends this process SIGTERM from its `__del__` and waits there: the run's handler
    raises `Interrupted` inside the collector's call, which Python prints and drops."""

    waited_out = False  # True: the handler never ran inside __del__

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(500):  # the handler runs in here, and its interrupt ends the loop
            time.sleep(0.01)
        _SignalInDel.waited_out = True


@stage("t.swallows", config=SourceConfig, outputs={"numbers": Table()})
def _swallows(ctx: StageContext, cfg: SourceConfig) -> StageResult:
    CALLS["swallows"] += 1
    _SignalInDel()  # dropped at once: its __del__ runs here
    return StageResult(tables={"numbers": pa.table({"x": [1]})})


def test_a_signal_whose_interrupt_was_dropped_still_stops_the_run_at_the_next_step(spec_file, catalog, monkeypatch):
    """A signal met inside a `__del__` or a weakref callback: the interrupt its handler raised
    is printed as "Exception ignored" and lost; the run still stops, before its next step
    (under load, a SIGTERM met in a `WeakSet` callback let `pipeline run` finish and exit 0)."""
    path = spec_file("run: {iterations: 3}\npipeline:\n  s: {stage: t.swallows}\n")
    dropped: list[BaseException | None] = []

    def hook(info):  # the hook the run finds: the dropped interrupt must not reach it ("Exception ignored in")
        dropped.append(info.exc_value)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    with pytest.raises(Interrupted) as stopped:
        run_spec(path, catalog)
    assert not _SignalInDel.waited_out  # the interrupt was raised inside __del__, and dropped there
    assert dropped == [] and sys.unraisablehook is hook  # not printed; the run put the hook back
    assert stopped.value.signum == signal.SIGTERM and stopped.value.at == "0:s"
    assert CALLS["swallows"] == 1
    assert query(catalog, "select status from runs").column(0).to_pylist() == ["interrupted"]


def test_a_run_sets_torch_threads_as_a_sweep_trial_does(spec_file, catalog, monkeypatch):
    """Every run sets torch's threads explicitly (`common.machine.pin_threads`), as a sweep trial sets its
    `trial_cpus`: on CPU the call alone changes the floats that follow, and a trial and a
    plain run of one point must compute alike. Its machine record names the count."""
    import json

    import torch

    calls: list[int] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    before = torch.get_num_threads()
    run_spec(spec_file(TEST_PIPELINE), catalog)
    assert calls[:1] == [before] and torch.get_num_threads() == before  # set, to the count it had
    machine = query(catalog, "select machine from runs").to_pylist()[0]["machine"]
    assert json.loads(machine)["threads"] == before
