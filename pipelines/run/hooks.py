"""Lifecycle hooks: what else happens while a run goes, apart from running stages.

The runner calls every hook at the same points of a run (Kedro's hooks, for a
pipeline that iterates):

    before_run(start)            the plan is made, nothing has run yet
    before_step(step)            a step is about to run (or be found cached)
    after_step(event)            a step is done: ran, cached or reused, with its metrics
    after_iteration(i, metrics)  iteration i's last step is done: its metrics, and the
                                 latest value of every metric reported so far
    on_warning(event)            an early warning fired (`pipelines.run.watch`)
    on_progress(progress)        a running step said how far it has got (`StageContext.progress`)
    on_error(error)              the run stops on an exception or a signal
    after_run(end)               the run is over: finished, failed or interrupted

The progress display (`pipelines.run.progress.DisplayHooks`), the early warnings
(`pipelines.run.watch.WarningHooks`) and the run's record in the catalog (`RunLogHooks`)
are hooks; a user adds their own with ``Runner(..., hooks=[...])`` (experiment
tracking is one). A hook subclasses `Hooks` and overrides what it needs; the
others do nothing. A hook's exception fails the run like a stage's would.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from catalog.runs import RunLog, RunRecord, StepRecord
from common import machine


@dataclass(frozen=True, kw_only=True)
class RunStart:
    """A run about to start: its name and spec (the file, the resolved settings as a
    mapping and as YAML), its iterations and seed, the steps of its plan, and the
    catalog root's URI."""

    run: str
    spec_file: str
    settings: Mapping[str, Any]
    spec_yaml: str
    iterations: int
    seed: int
    steps: int
    catalog: str
    recorded: str | None = None  # every typed setting with its source, as JSON (`pipelines.spec.explain.recorded`)


def progress_seconds() -> float:
    """How often, at most, a run's progress reaches a log and the run record, and the
    longest a plain (non-terminal) display stays silent: 30 s, or
    ``$PIPELINE_PROGRESS_SECONDS``."""
    try:
        return max(0.1, float(os.environ.get("PIPELINE_PROGRESS_SECONDS", "30")))
    except ValueError:
        return 30.0


def duration(seconds: float) -> str:
    """``42s``, ``6m27s``."""
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


@dataclass(frozen=True)
class StepProgress:
    """`done` of `total` `unit` of a running step, `seconds` after it started."""

    label: str
    done: int
    total: int
    unit: str
    seconds: float

    def text(self) -> str:
        """e.g. ``pretrain: 300/1500 steps, 3.1/s, 6m27s left``."""
        out = f"{self.label}: {self.done}/{self.total} {self.unit}"
        if self.done > 0 and self.seconds > 0:
            rate = self.done / self.seconds
            out += f", {rate:.3g}/s"
            if self.total > self.done:
                out += f", {duration((self.total - self.done) / rate)} left"
        return out


@dataclass(frozen=True, kw_only=True)
class StepStart:
    """A step about to run: its display label, node, stage, iteration and key."""

    label: str
    node: str
    stage: str
    iteration: int | None
    key: str


@dataclass(frozen=True, kw_only=True)
class StepEvent:
    """A finished step, as displayed and summarised."""

    label: str
    node: str
    key: str
    status: str  # "ran" | "cached" | "reused" (a periodic step run earlier in this run)
    seconds: float
    metrics: Mapping[str, float]
    iteration: int | None = None
    stage: str = ""
    finished: float = 0.0  # when the step ended (UNIX time)
    placement: str | None = None  # where a step that ran did, as JSON (`pipelines.run.steps.StepRunner.placed`)


@dataclass(frozen=True)
class Event:
    """A fired early warning (`pipelines.run.watch`): `reference` is what the value was
    compared with."""

    iteration: int
    rule: str
    metric: str
    value: float
    reference: float
    threshold: float
    message: str


@dataclass(frozen=True, kw_only=True)
class RunEnd:
    """How a run ended: "finished", "failed" or "interrupted", its wall time, and for
    a run that did not finish, what stopped it."""

    run: str
    status: str
    seconds: float
    message: str = ""


class Hooks:
    """The hook points (see the module docstring); each does nothing here."""

    def before_run(self, start: RunStart) -> None:
        pass

    def before_step(self, step: StepStart) -> None:
        pass

    def after_step(self, event: StepEvent) -> None:
        pass

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        pass

    def on_warning(self, event: Event) -> None:
        pass

    def on_progress(self, progress: StepProgress) -> None:
        """How far a running step has got (`StageContext.progress`), at most twice a
        second per step. Called on the step's own thread: several at once under
        ``run.concurrency``."""

    def on_error(self, error: BaseException) -> None:
        pass

    def after_run(self, end: RunEnd) -> None:
        pass


class HookList(Hooks):
    """Several hooks called in order, as one."""

    def __init__(self, hooks: list[Hooks]) -> None:
        self.hooks = hooks

    def _each(self, name: str, *args: Any) -> None:
        for hook in self.hooks:
            getattr(hook, name)(*args)

    def before_run(self, start: RunStart) -> None:
        self._each("before_run", start)

    def before_step(self, step: StepStart) -> None:
        self._each("before_step", step)

    def after_step(self, event: StepEvent) -> None:
        self._each("after_step", event)

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        self._each("after_iteration", iteration, metrics, latest)

    def on_warning(self, event: Event) -> None:
        self._each("on_warning", event)

    def on_progress(self, progress: StepProgress) -> None:
        self._each("on_progress", progress)

    def on_error(self, error: BaseException) -> None:
        self._each("on_error", error)

    def after_run(self, end: RunEnd) -> None:
        self._each("after_run", end)


class RunLogHooks(Hooks):
    """The run's record in the catalog (``runs/<run>/``: the `runs`, `steps` and
    `events` views): its spec when it starts, a row per step, its warnings, and how
    it ended."""

    def __init__(self, root: Any, every: float | None = None) -> None:
        self.root = root
        self.log: RunLog | None = None
        self.every = progress_seconds() if every is None else every  # at most one record write per this long
        self.saved = 0.0
        self.lock = threading.Lock()

    def before_run(self, start: RunStart) -> None:
        record = RunRecord(
            run=start.run,
            spec_file=start.spec_file,
            spec=start.spec_yaml,
            iterations=start.iterations,
            seed=start.seed,
            settings=start.recorded,
            machine=machine.recorded(),
        )
        self.log = RunLog(self.root, record)

    def on_progress(self, progress: StepProgress) -> None:
        if self.log is None:
            return
        now = time.monotonic()
        with self.lock:
            if now - self.saved < self.every:
                return
            self.saved = now
            self.log.record.progress = progress.text()
            self.log.save()

    def after_step(self, event: StepEvent) -> None:
        assert self.log is not None
        with self.lock:
            if self.log.record.progress is not None:  # the step it told of is over
                self.log.record.progress = None
                self.log.save()
        self.log.add_step(
            StepRecord(
                self.log.record.run,
                event.iteration,
                event.node,
                event.stage,
                event.key,
                event.status,
                event.seconds,
                event.finished,
                placement=event.placement,
            )
        )

    def on_warning(self, event: Event) -> None:
        assert self.log is not None
        self.log.add_events([asdict(event)])

    def after_run(self, end: RunEnd) -> None:
        if self.log is None:
            return
        if end.status == "finished":
            self.log.finish(end.status, end.message or None)
            return
        with contextlib.suppress(OSError):  # the run is failing already: a read-only catalog does not hide why
            self.log.finish(end.status, end.message or None)


class IterationCallback(Hooks):
    """`callback(i, latest)` at the end of every iteration (how a sweep trial reports)."""

    def __init__(self, callback: Callable[[int, dict[str, float]], None]) -> None:
        self.callback = callback

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        self.callback(iteration, dict(latest))
