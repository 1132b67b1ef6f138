"""Progress inside long steps: what a stage says (`StageContext.progress`) reaches the
display with its rate and time left, the run record while the step runs, and a log
never stays silent for longer than the interval."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from catalog.query import query
from catalog.store import Catalog
from pipelines.run.hooks import RunLogHooks, RunStart, StepEvent, StepProgress
from tests.conftest import SMALL_DEFAULT


def test_the_progress_line_says_the_count_the_rate_and_the_time_left():
    assert StepProgress("pretrain", 300, 1500, "steps", 100.0).text() == "pretrain: 300/1500 steps, 3/s, 6m40s left"
    assert StepProgress("eval", 0, 64, "episodes", 5.0).text() == "eval: 0/64 episodes"
    assert StepProgress("0:update", 4, 4, "mini-batches", 2.0).text() == "0:update: 4/4 mini-batches, 2/s"


def test_the_run_record_keeps_a_running_steps_progress_and_clears_it_after(tmp_path):
    catalog = Catalog(str(tmp_path / "cat"))
    hooks = RunLogHooks(catalog.root, every=0.0)
    hooks.before_run(
        RunStart(run="r", spec_file="s.yaml", settings={}, spec_yaml="", iterations=1, seed=0, steps=1, catalog="c")
    )
    hooks.on_progress(StepProgress("pretrain", 30, 100, "steps", 10.0))
    assert query(catalog, "select progress from runs").to_pylist() == [
        {"progress": "pretrain: 30/100 steps, 3/s, 23s left"}
    ]
    hooks.after_step(
        StepEvent(
            label="pretrain",
            iteration=None,
            node="pretrain",
            stage="pretrain",
            key="pretrain-0",
            status="ran",
            seconds=1.0,
            finished=time.time(),
            metrics={},
        )
    )
    assert query(catalog, "select progress from runs").to_pylist() == [{"progress": None}]


def test_an_update_in_ray_train_tells_its_mini_batches():
    from stages.training.signals import tell_progress, watch_progress

    class Ctx:
        def __init__(self) -> None:
            self.seen: list[tuple[int, int, str]] = []

        def progress(self, done: int, total: int, unit: str) -> None:
            self.seen.append((done, total, unit))

    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        ctx = Ctx()
        with watch_progress(ctx, Path(scratch), every=0.05):
            for done in range(3):
                tell_progress(scratch, done, 3)
                time.sleep(0.2)
        assert ctx.seen == [(0, 3, "mini-batches"), (1, 3, "mini-batches"), (2, 3, "mini-batches")]
        # a context without progress (a fit outside a run) is left alone
        with watch_progress(object(), Path(scratch)):
            pass


def test_a_long_pretrain_is_never_silent_and_shows_its_progress(tmp_path):
    """The default spec with a pretraining of some seconds, in a log (not a terminal),
    with the interval at 1 s instead of 30: no gap between two lines longer than two
    intervals, and the pretrain's count, rate and time left among them. (The run stops
    after the pretraining, `--to pretrain`: the warm start and its eval would hold
    nothing more here and cost the suite CPU.)"""
    exe = Path(sys.executable).parent / "pipeline"
    env = {**os.environ, "PIPELINE_CATALOG": "", "PIPELINE_PROGRESS_SECONDS": "1"}
    small = [o for o in SMALL_DEFAULT if not o.startswith("pretrain.steps")] + ["pretrain.steps=300"]
    args = [a for o in ["run.iterations=1", *small] for a in ("-o", o)]
    proc = subprocess.Popen(
        [str(exe), "run", "starpo.yaml", "--to", "pretrain", *args],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    assert proc.wait(timeout=300) == 0, "\n".join(text for _, text in lines)
    reader.join()
    texts = [text for _, text in lines]
    started = next(i for i, text in enumerate(texts) if text.startswith("run "))
    pretrain_ran = next(i for i, text in enumerate(texts) if text.strip().startswith("pretrain ") and " ran " in text)
    told = [t for t in texts[started:pretrain_ran] if "pretrain: " in t and "/300 steps" in t]
    assert any("/s, " in t and " left" in t for t in told), texts
    times = [t for t, _ in lines[started:]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= 2.5, list(zip(gaps, texts[started + 1 :], strict=False))
