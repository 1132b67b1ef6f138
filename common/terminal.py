"""The terminal a command prints to."""

from __future__ import annotations

import shutil


def terminal_width(fallback: int = 120) -> int:
    """The width a printed table must fit: the terminal's, ``$COLUMNS`` where set (also
    when the output is a pipe), else `fallback`."""
    return max(40, shutil.get_terminal_size((fallback, 24)).columns)
