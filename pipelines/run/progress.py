"""What a run shows while it goes: a progress bar over steps, one line a step, and
a summary table at the end. `Quiet` records the same events without printing.

Inside a long step (pretraining, a warm start, an eval, an update) the stage says how
far it has got (`StageContext.progress`): on a terminal the bar shows it, with the rate
and the time left; elsewhere (a log, CI) a line tells it at most every
`progress_seconds()` (30 s), and a step that says nothing for that long gets a line
that it is still running, so a run is never silent for longer."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from common.terminal import terminal_width
from pipelines.run.hooks import (
    Event,
    Hooks,
    RunEnd,
    RunStart,
    StepEvent,
    StepProgress,
    StepStart,
    duration,
    progress_seconds,
)


class Display(Protocol):
    def start(self, run: str, total: int, root: str) -> None: ...
    def step_started(self, label: str) -> None: ...
    def step_done(self, event: StepEvent) -> None: ...
    def log(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def progress(self, progress: StepProgress) -> None: ...
    def finish(self, status: str, seconds: float) -> None: ...


@dataclass
class Quiet:
    """A display that only keeps the events (tests, library use)."""

    events: list[StepEvent] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    progressed: list[StepProgress] = field(default_factory=list)

    def start(self, run: str, total: int, root: str) -> None: ...
    def step_started(self, label: str) -> None: ...
    def step_done(self, event: StepEvent) -> None:
        self.events.append(event)

    def log(self, message: str) -> None:
        self.messages.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def progress(self, progress: StepProgress) -> None:
        self.progressed.append(progress)

    def finish(self, status: str, seconds: float) -> None: ...


def _brief(metrics: Mapping[str, float], limit: int = 3) -> str:
    shown = [(k, v) for k, v in metrics.items() if not k.startswith("perf/")][:limit]
    return "  ".join(f"{k}={v:.4g}" for k, v in shown)


class RichDisplay(Quiet):
    """Live progress on a terminal; plain lines elsewhere (CI logs), never more than
    `progress_seconds()` apart while a step runs (module docstring)."""

    def __init__(self, every: float | None = None) -> None:
        super().__init__()
        self.tty = sys.stderr.isatty()
        self.every = progress_seconds() if every is None else every
        self.lock = threading.Lock()
        self.said = time.monotonic()  # when the last line was printed
        self.running: dict[str, tuple[float, str]] = {}  # label -> (started, what its progress last said)
        self.stop = threading.Event()
        self.beat: threading.Thread | None = None
        self.console = Console(stderr=True, highlight=False, width=None if self.tty else terminal_width(160))
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not sys.stderr.isatty(),
        )
        self.task: TaskID | None = None

    def _print(self, text: str) -> None:
        with self.lock:
            self.said = time.monotonic()
            self.bar.console.print(text)

    def start(self, run: str, total: int, root: str) -> None:
        self._print(f"run [bold]{run}[/]: {total} steps, catalog {root}")
        self.bar.start()
        self.task = self.bar.add_task("starting", total=total)
        if not self.tty:
            self.beat = threading.Thread(target=self._heartbeat, name="display-heartbeat", daemon=True)
            self.beat.start()

    def _describe(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, description=" + ".join(text for _, text in self.running.values()))

    def step_started(self, label: str) -> None:
        with self.lock:
            self.running[label] = (time.monotonic(), label)
            self._describe()

    def progress(self, progress: StepProgress) -> None:  # shown, not kept (unlike `Quiet`)
        with self.lock:
            if progress.label in self.running:
                self.running[progress.label] = (self.running[progress.label][0], progress.text())
            self._describe()
            due = not self.tty and time.monotonic() - self.said >= self.every
        if due:
            self._print(f"  [dim]{progress.text()}[/]")

    def _heartbeat(self) -> None:
        """Elsewhere than a terminal: a line for each running step once nothing was
        printed for `every` seconds."""
        while not self.stop.wait(min(1.0, self.every / 4)):
            with self.lock:
                quiet_for = time.monotonic() - self.said
                running = list(self.running.items())
            if quiet_for < self.every or not running:
                continue
            for label, (started, said) in running:
                took = duration(time.monotonic() - started)
                self._print(
                    f"  [dim]{said} (running {took})[/]" if said != label else f"  [dim]{label}: running {took}[/]"
                )

    def step_done(self, event: StepEvent) -> None:
        super().step_done(event)
        mark = {"ran": "[green]ran   [/]", "reused": "[cyan]reused[/]"}.get(event.status, "[dim]cached[/]")
        with self.lock:
            self.running.pop(event.label, None)
            self._describe()
        self._print(f"  {event.label:<24} {mark} {event.seconds:7.2f}s  [dim]{event.key}[/]  {_brief(event.metrics)}")
        if self.task is not None:
            self.bar.advance(self.task)

    def log(self, message: str) -> None:
        super().log(message)
        self._print(f"  [dim]{message}[/]")

    def warn(self, message: str) -> None:
        super().warn(message)
        self._print(f"  [bold yellow]{message}[/]")

    def finish(self, status: str, seconds: float) -> None:
        self.stop.set()
        if self.beat is not None:
            self.beat.join()
        self.bar.stop()
        table = Table(title=f"{status} in {seconds:.1f}s", title_justify="left")
        for col in ("stage", "ran", "cached", "seconds", "last metrics"):
            table.add_column(col)
        by_node: dict[str, list[StepEvent]] = defaultdict(list)
        for e in self.events:
            by_node[e.node].append(e)
        for node, evs in by_node.items():
            ran = [e for e in evs if e.status == "ran"]
            table.add_row(
                node,
                str(len(ran)),
                str(len(evs) - len(ran)),
                f"{sum(e.seconds for e in ran):.2f}",
                _brief(evs[-1].metrics),
            )
        self.console.print(table)


class DisplayHooks(Hooks):
    """Shows a run on a `Display` (`pipelines.run.hooks`)."""

    def __init__(self, display: Display) -> None:
        self.display = display

    def before_run(self, start: RunStart) -> None:
        self.display.start(start.run, start.steps, start.catalog)

    def before_step(self, step: StepStart) -> None:
        self.display.step_started(step.label)

    def on_progress(self, progress: StepProgress) -> None:
        self.display.progress(progress)

    def after_step(self, event: StepEvent) -> None:
        self.display.step_done(event)

    def on_warning(self, event: Event) -> None:
        self.display.warn(f"warning at iteration {event.iteration}: {event.message}")

    def after_run(self, end: RunEnd) -> None:
        self.display.finish(end.status, end.seconds)
