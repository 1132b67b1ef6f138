"""`run.concurrency`: steps whose inputs are committed run at once, one per host; the
keys, results and run record are those of the same run step by step; a failure stops
the run cleanly."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from catalog.datasets import Table, TableRef
from catalog.query import query
from common.config import param
from common.errors import StageFailed
from pipelines.graph.load import load_spec
from pipelines.graph.plan import dependencies
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from stages.registry import StageContext, StageResult, stage

SCORE = {"rollout/score_mean": "synthetic"}
IN_FLIGHT: list[int] = [0, 0]  # now, most at once
LOCK = threading.Lock()


@dataclass(frozen=True)
class WorkConfig:
    seconds: float = param(0.3, "how long a step works", ge=0, key=False)
    fail_at: int | None = param(None, "the iteration whose step raises", key=False)


def _work(ctx: StageContext, cfg: WorkConfig, value: float) -> StageResult:
    with LOCK:
        IN_FLIGHT[0] += 1
        IN_FLIGHT[1] = max(IN_FLIGHT)
    try:
        time.sleep(cfg.seconds)
        if cfg.fail_at == ctx.iteration:
            raise RuntimeError("boom")
        return StageResult(tables={"out": pa.table({"v": [value]})}, metrics={"rollout/score_mean": value})
    finally:
        with LOCK:
            IN_FLIGHT[0] -= 1


@stage("t.play", config=WorkConfig, outputs={"out": Table()}, host=lambda cfg: "engine", metrics=SCORE)
def play(ctx: StageContext, cfg: WorkConfig) -> StageResult:
    """An engine-hosted step that reads nothing."""
    return _work(ctx, cfg, float(ctx.iteration or 0))


@stage("t.learn", config=WorkConfig, outputs={"learned": Table()}, metrics=SCORE)
def learn(ctx: StageContext, cfg: WorkConfig, played: TableRef) -> StageResult:
    """A driver step that reads the play step's table."""
    result = _work(ctx, cfg, float(played.read()["v"][0].as_py()) + 0.5)
    return StageResult(tables={"learned": result.tables["out"]}, metrics=result.metrics)


SPEC = """
run: {iterations: 4}
pipeline:
  play: {stage: t.play}
  learn: {stage: t.learn, inputs: {played: out}}
"""


def run(spec_file, catalog, *overrides: str) -> tuple[Runner, Quiet]:
    IN_FLIGHT[:] = [0, 0]
    display = Quiet()
    runner = Runner(load_spec(spec_file(SPEC), overrides), catalog, display)
    runner.run()
    return runner, display


def test_steps_on_different_hosts_overlap_and_keep_the_keys(spec_file, catalog, tmp_path):
    runner, display = run(spec_file, catalog, "run.concurrency=2")
    assert IN_FLIGHT[1] == 2  # the next play beside this iteration's learn
    steps = query(
        catalog, "select node, iteration, epoch(finished_at) - seconds t0, epoch(finished_at) t1 from steps"
    ).to_pylist()
    plays = [s for s in steps if s["node"] == "play"]
    learns = [s for s in steps if s["node"] == "learn"]
    assert any(p["t0"] < q["t1"] and q["t0"] < p["t1"] for p in plays for q in learns)
    # the same spec step by step: the same keys and the same metrics
    from catalog.store import Catalog

    alone = Catalog(str(tmp_path / "alone"))
    sequential, _ = run(spec_file, alone)
    assert IN_FLIGHT[1] == 1
    assert [s.key for s in sequential.steps] == [s.key for s in runner.steps]
    metrics = "select key, name, value from metrics where name not like 'perf/%' order by all"
    assert query(catalog, metrics).to_pylist() == query(alone, metrics).to_pylist()
    # each step's events in order, every iteration ended once, in order
    labels = [e.label for e in display.events]
    assert sorted(labels) == sorted(s.label for s in runner.steps)
    assert all(labels.index(f"{i}:play") < labels.index(f"{i}:learn") for i in range(4))


def test_one_host_runs_one_step_at_a_time(spec_file, catalog):
    # two engine-hosted nodes that read nothing: never at once
    text = (
        "run: {iterations: 3, concurrency: 4}\npipeline:\n  a: {stage: t.play}\n"
        "  b: {stage: t.play, outputs: {out: other}}\n"
    )
    Runner(load_spec(spec_file(text, "two.yaml")), catalog, Quiet()).run()
    assert IN_FLIGHT[1] == 1


def test_a_failure_waits_for_the_step_in_flight_and_fails_the_run(spec_file, catalog):
    with pytest.raises(StageFailed):
        run(spec_file, catalog, "run.concurrency=2", "learn.fail_at=1", "play.seconds=0.6")
    record = query(catalog, "select status from runs").column(0).to_pylist()
    assert record == ["failed"]
    done = {(r["node"], r["iteration"]) for r in query(catalog, "select node, iteration from steps").to_pylist()}
    assert ("learn", 0) in done and ("play", 2) in done  # play 2 was in flight beside learn 1: it committed
    assert ("learn", 1) not in done and ("play", 3) not in done  # nothing started after the failure
    assert not [p for p in Path(catalog.root.path("_staging")).glob("*") if p.name != "leases"]
    # the same command again resumes: only what is missing runs
    IN_FLIGHT[:] = [0, 0]
    summary = Runner(load_spec(spec_file(SPEC), ("run.concurrency=2",)), catalog, Quiet()).run()
    assert (summary.ran, summary.cached) == (8 - len(done), len(done))


def test_dependencies_follow_the_inputs(spec_file, catalog):
    runner = Runner(load_spec(spec_file(SPEC)), catalog, Quiet())
    deps = dependencies(runner.steps)
    labels = [s.label for s in runner.steps]
    assert {labels[d] for d in deps[labels.index("2:learn")]} == {"2:play"}
    assert deps[labels.index("2:play")] == set()
