"""The terminal a command prints to."""

from __future__ import annotations

import os
import shutil
import sys


def terminal_width(fallback: int = 200) -> int:
    """The width a printed table must fit: ``$COLUMNS`` where set, else the terminal's
    when the output is one; `fallback` when it is a pipe or a file (a script reading the
    output gets its words whole, unfolded)."""
    if os.environ.get("COLUMNS", "").isdigit():
        return max(40, int(os.environ["COLUMNS"]))
    if sys.stdout.isatty():
        return max(40, shutil.get_terminal_size((fallback, 24)).columns)
    return fallback
