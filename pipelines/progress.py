"""What a run shows while it goes: a progress bar over steps, one line a step, and
a summary table at the end. `Quiet` records the same events without printing."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipelines.hooks import Event, Hooks, RunEnd, RunStart, StepEvent, StepStart


class Display(Protocol):
    def start(self, run: str, total: int, root: str) -> None: ...
    def step_started(self, label: str) -> None: ...
    def step_done(self, event: StepEvent) -> None: ...
    def log(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def finish(self, status: str, seconds: float) -> None: ...


@dataclass
class Quiet:
    """A display that only keeps the events (tests, library use)."""

    events: list[StepEvent] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def start(self, run: str, total: int, root: str) -> None: ...
    def step_started(self, label: str) -> None: ...
    def step_done(self, event: StepEvent) -> None:
        self.events.append(event)

    def log(self, message: str) -> None:
        self.messages.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def finish(self, status: str, seconds: float) -> None: ...


def _brief(metrics: Mapping[str, float], limit: int = 3) -> str:
    shown = [(k, v) for k, v in metrics.items() if not k.startswith("perf/")][:limit]
    return "  ".join(f"{k}={v:.4g}" for k, v in shown)


class RichDisplay(Quiet):
    """Live progress on a terminal; plain lines elsewhere (CI logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not sys.stderr.isatty(),
        )
        self.task: TaskID | None = None

    def start(self, run: str, total: int, root: str) -> None:
        self.console.print(f"run [bold]{run}[/]: {total} steps, catalog {root}")
        self.progress.start()
        self.task = self.progress.add_task("starting", total=total)

    def step_started(self, label: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=label)

    def step_done(self, event: StepEvent) -> None:
        super().step_done(event)
        mark = {"ran": "[green]ran   [/]", "reused": "[cyan]reused[/]"}.get(event.status, "[dim]cached[/]")
        self.progress.console.print(
            f"  {event.label:<24} {mark} {event.seconds:7.2f}s  [dim]{event.key}[/]  {_brief(event.metrics)}"
        )
        if self.task is not None:
            self.progress.advance(self.task)

    def log(self, message: str) -> None:
        super().log(message)
        self.progress.console.print(f"  [dim]{message}[/]")

    def warn(self, message: str) -> None:
        super().warn(message)
        self.progress.console.print(f"  [bold yellow]{message}[/]")

    def finish(self, status: str, seconds: float) -> None:
        self.progress.stop()
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
    """Shows a run on a `Display` (`pipelines.hooks`)."""

    def __init__(self, display: Display) -> None:
        self.display = display
        self.in_flight: list[str] = []  # labels of the steps started and not done (several with run.concurrency)

    def before_run(self, start: RunStart) -> None:
        self.display.start(start.run, start.steps, start.catalog)

    def before_step(self, step: StepStart) -> None:
        self.in_flight.append(step.label)
        self.display.step_started(" + ".join(self.in_flight))

    def after_step(self, event: StepEvent) -> None:
        if event.label in self.in_flight:
            self.in_flight.remove(event.label)
        self.display.step_done(event)

    def on_warning(self, event: Event) -> None:
        self.display.warn(f"warning at iteration {event.iteration}: {event.message}")

    def after_run(self, end: RunEnd) -> None:
        self.display.finish(end.status, end.seconds)
