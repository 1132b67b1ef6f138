"""What a Ray Train loop tells the driver through the fit's scratch folder (a folder
beside the staged result that the loop and `stages.training.fit.fit` both reach when the
workers run on this machine): how many mini-batches rank 0 has done, shown as the
step's progress while the fit runs, and a line per start of the loop on rank 0, so that
a restarted worker group is counted. Workers on another machine write into their own
folder: the step then shows no count, and its restarts are unknown (no metric)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import live
from stages.training.sharding import world

#: rank 0's mini-batches done and in all
PROGRESS_FILE = "progress.json"
#: a line per start of the loop on rank 0: more than one is a restart of the worker group
STARTS_FILE = "starts"


def _rank0_file(scratch: str | None, name: str) -> Path | None:
    return None if scratch is None or world()[0] != 0 else Path(scratch) / name


def tell_start(scratch: str | None) -> None:
    path = _rank0_file(scratch, STARTS_FILE)
    if path is not None:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write("start\n")


def tell_progress(scratch: str | None, done: int, total: int) -> None:
    path = _rank0_file(scratch, PROGRESS_FILE)
    if path is not None:
        with contextlib.suppress(OSError):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"mini_batches": [done, total]}))
            tmp.replace(path)


def restarts(scratch: Path) -> int | None:
    """Restarts of the worker group in this fit; None when rank 0 could not say (it ran
    on another machine, whose scratch folder is its own): unknown, not 0."""
    try:
        return max(0, len((scratch / STARTS_FILE).read_text().splitlines()) - 1)
    except OSError:
        return None


@contextlib.contextmanager
def watch_progress(ctx: Any, scratch: Path, every: float = 1.0) -> Iterator[None]:
    """While the fit runs, pass what rank 0 writes (`tell_progress`) on to
    `ctx.progress` (a `StageContext`; other contexts have none)."""
    report = getattr(ctx, "progress", None)
    if report is None:
        yield
        return
    stop = threading.Event()
    path = scratch / PROGRESS_FILE

    def poll() -> None:
        seen = None
        while not stop.wait(every):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                done, total = (int(x) for x in json.loads(path.read_text())["mini_batches"])
                if (done, total) != seen:
                    seen = (done, total)
                    report(done, total, "mini-batches")

    thread = live.thread(poll, "fit-progress")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
