"""What a training loop tells the driver through the fit's scratch folder."""

from __future__ import annotations

from pathlib import Path

from stages.training import signals


def test_restarts_are_counted_where_rank_0_could_write_and_unknown_where_not(tmp_path: Path):
    signals.tell_start(str(tmp_path))
    assert signals.restarts(tmp_path) == 0
    signals.tell_start(str(tmp_path))
    assert signals.restarts(tmp_path) == 1
    # rank 0 on another machine: its scratch folder is its own, nothing arrives here
    signals.tell_start(str(tmp_path / "elsewhere" / "not-here"))
    assert signals.restarts(tmp_path / "elsewhere") is None  # unknown, not 0
