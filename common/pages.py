"""The pages a reader reads: the README and docs/. Both experiments/docstyle.py (how they
read) and experiments/render.py (the tables in them) walk this list."""

from __future__ import annotations

from pathlib import Path

#: the repository root
ROOT = Path(__file__).resolve().parent.parent


def pages() -> list[Path]:
    """The README and every page of docs/ (the history included: the caller decides)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
