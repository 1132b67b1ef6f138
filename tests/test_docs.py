"""The docs' metrics table lists every metric a registered stage declares."""

from pathlib import Path

import stages  # noqa: F401  (registers the stages)
from stages.registry import STAGES

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def test_every_declared_metric_is_documented():
    text = DOC.read_text()
    missing = [m for s in STAGES.values() if not s.name.startswith("t.") for m in s.metrics if f"`{m}`" not in text]
    assert not missing, f"add to docs/metrics.md: {missing}"


def test_every_trajectory_column_is_documented():
    import re

    from catalog.schemas import TRAJECTORY_SCHEMA, TURN

    words = set(re.findall(r"[a-z_]+", (DOC.parent / "trajectories.md").read_text()))
    names = TRAJECTORY_SCHEMA.names + [f.name for f in TURN]
    assert not [n for n in names if n not in words]
