"""The docs' metrics table lists every metric a registered stage declares."""

from pathlib import Path

import stages  # noqa: F401  (registers the stages)
from stages.registry import BUILT_IN

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def test_every_declared_metric_is_documented():
    text = DOC.read_text()
    missing = [m for s in BUILT_IN.values() for m in s.metrics if f"`{m}`" not in text]
    assert not missing, f"add to docs/metrics.md: {missing}"


def test_every_trajectory_column_is_documented():
    """Each column is the first cell of a row of the column table, and each turn field a
    backticked entry of the `turns` section (a name in prose does not count)."""
    import re

    from catalog.schemas import TRAJECTORY_SCHEMA, TURN

    text = (DOC.parent / "trajectories.md").read_text()
    rows = {n.strip() for line in text.splitlines() if line.startswith("| ") for n in line.split("|")[1].split(",")}
    assert not [n for n in TRAJECTORY_SCHEMA.names if n not in rows]
    section = text.split("## `turns`", 1)[1].split("\n## ", 1)[0]
    entries = {n.strip() for span in re.findall(r"`([^`]+)`", section) for n in span.split(",")}
    assert not [f.name for f in TURN if f.name not in entries]
