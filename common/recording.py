"""A result file: what a bench or an experiment printed and its provenance, kept in
`results/` beside the script (`bench/results/`, `experiments/results/`), so a figure quoted
in the README or `docs/` can be traced to its command and checked against it
(`experiments/render.py` writes the tables from it, `tests/test_readme.py` checks the rest).

Provenance: the command as a reader can type it (the catalog as `CATALOG`, no path of the
machine that ran it), the commit, the date, the machine's class, the wall time, the status
(`current`, or `superseded` by the record `superseded_by` names) and caveats. A record also
names the kind of CPU it ran on (`cpu`: model and kernel flags, `common.machine.kernel_kind`):
the same code and seed give other floats on another kind.

    out = Recorder()
    out.line("| 0 | 29.3% | ...")       # printed, and kept
    out.save("seeds-starpo")           # experiments/results/seeds-starpo.json, run as experiments/seeds.py
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.machine import kernel_kind, machine_class

#: the process's start, for a record's wall time
STARTED = time.monotonic()
#: what scripts write, left out of "dirty": a script that saves several results (or draws a plot
#: the docs show) is still at the commit of its code after the first one is written
OUTPUTS = (":(exclude)bench/results", ":(exclude)experiments/results", ":(exclude)docs/images")


def commit() -> str:
    """The checkout's commit, with `+dirty` where tracked files other than the scripts'
    outputs (`OUTPUTS`) differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", ".", *OUTPUTS], cwd=root, check=False
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


class Recorder:
    """Prints lines and keeps them for the result file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        print(text)
        self.lines.append(text)

    def save(self, name: str, data: dict[str, Any] | None = None) -> Path:
        """Write `results/<name>.json` beside the running script (atomically) and say so."""
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum() or name.startswith("."):
            raise SystemExit(f"error: --save {name!r}: expected letters, digits, '-', '_' or '.'")
        folder = Path(sys.argv[0]).resolve().parent / "results"
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.json"
        record = {
            "command": portable([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
            "commit": commit(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine_class(),
            "cpu": kernel_kind(),  # the kind its floats repeat on (records before 2026-12-08 lack it)
            "wall_s": round(time.monotonic() - STARTED, 1),
            "status": "current",
            "superseded_by": None,
            "caveats": [],
            "printed": self.lines,
            "data": data or {},
        }
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(path)
        print(f"written: {os.path.relpath(path)}")
        return path


def portable(argv: list[str]) -> str:
    """`python` and `argv` as a reader types them again, quoted: the catalog as `CATALOG`,
    and an option whose value is a path outside the checkout (a scratch plot) left out."""
    root = Path(__file__).resolve().parent.parent
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if word == "--catalog" and value is not None:
            out += [word, "CATALOG"]
            i += 2
            continue
        if word.startswith("--catalog="):
            out.append("--catalog=CATALOG")
        elif word.startswith("-") and value is not None and Path(value).is_absolute():
            if Path(value).resolve().is_relative_to(root):
                out += [word, os.path.relpath(Path(value).resolve(), root)]
            i += 2
            continue
        else:
            out.append(word)
        i += 1
    return "python " + shlex.join(out)


def run_script(main: Callable[[], None]) -> None:
    """Run a script's `main`: a user's mistake (a mistyped catalog, bad SQL input: a
    `UserError`) is one line on stderr and exit status 2, not a traceback."""
    from common.errors import UserError

    try:
        main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def same_measure(option: str, theirs: str, ours: str) -> None:
    """Exit with one line unless a saved table (`--also`: its first printed line, `theirs`)
    measured what this one does (`ours`): the same temperature, environment and versions,
    whatever runs or seeds each holds (a trailing ``run seeds [...]`` is not compared)."""
    import re

    def what(head: str) -> str:
        return re.sub(r",? run seeds \[.*\]$", "", head)

    if what(theirs) != what(ours):
        sys.exit(f"error: {option}: it measured {what(theirs)!r}, not {what(ours)!r}")


def fastest(fn: Callable[[], Any], tries: int = 3) -> float:
    """Seconds of the fastest of `tries` calls of `fn` (a bench's timing: the first call
    warms caches, the slower ones are the machine's noise)."""
    times = []
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
