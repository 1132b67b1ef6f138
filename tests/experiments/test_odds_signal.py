"""experiments/odds_signal.py: what a bandit run with odds drawn at each reset had to learn from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "odds_signal", Path(__file__).resolve().parents[2] / "experiments" / "odds_signal.py"
)
assert spec is not None and spec.loader is not None
odds_signal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(odds_signal)


def episode(action: str, better: bool, score: float) -> dict:
    """One episode: `action` is the gamble or the sure arm; `better`: the gamble is the better arm."""
    success = (action == "gamble") == better
    return {"action": action, "score": score, "success": success, "gamble_better": better}


def test_answering_the_gamble_scores_on_one_side_only_and_splits_no_group():
    groups = {
        ("shortcut", 0, 0): [episode("gamble", True, 1.0), episode("gamble", True, 0.0)],
        ("shortcut", 0, 1): [episode("gamble", False, 0.0), episode("gamble", False, 0.0)],
    }
    (row,) = odds_signal.blocks(groups, {("shortcut", 0): {"filter/kept_trajectories": 0}}, block=5)
    assert row["gamble_better"] == "100.0%" and row["gamble_worse"] == "0.0%"
    assert row["groups_split"] == "0.0%" and row["reward_gap"] == "-" and row["kept"] == "0 / 4"


def test_a_split_group_shows_what_comparing_earned_with_its_noise():
    groups = {
        ("mixed", 0, 0): [episode("sure", False, 0.1), episode("gamble", False, 0.0)],  # the sure arm was better
        ("mixed", 0, 1): [episode("gamble", True, 0.0), episode("sure", True, 0.1)],  # the gamble lost this time
        ("mixed", 6, 0): [episode("sure", True, 0.1), episode("sure", True, 0.1)],
    }
    rows = odds_signal.blocks(groups, {("mixed", 0): {"filter/kept_trajectories": 4}}, block=5)
    assert [r["iterations"] for r in rows] == [[0, 4], [5, 6]]
    first, second = rows
    assert first["groups_split"] == "100.0%" and first["kept"] == "4 / 4"
    assert first["reward_gap"] == "+0.000"  # +0.1 where the sure arm was better, -0.1 where the gamble did not pay
    assert first["gamble_better"] == "50.0%" and first["gamble_worse"] == "50.0%"
    assert second["gamble_better"] == "0.0%" and second["gamble_worse"] == "-" and second["groups_split"] == "0.0%"
