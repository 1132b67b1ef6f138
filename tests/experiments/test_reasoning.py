"""experiments/reasoning.py: a bandit thought checked by rule against the prompt it saw."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "reasoning", Path(__file__).resolve().parents[2] / "experiments" / "reasoning.py"
)
assert spec is not None and spec.loader is not None
reasoning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reasoning)

STATE = "Arms: Dragon, Phoenix. Which arm do you pull?"
RIGHT = " Dragon pays 0.1 on average. Phoenix pays 1 x 0.25 = 0.25 on average. "


def test_a_right_thought_and_an_answer_that_follows_it():
    assert reasoning.judge(STATE, RIGHT, "Phoenix", True, "Phoenix") == {
        "states": True,
        "right": True,
        "follows": True,
        "success": True,
    }


def test_a_right_thought_the_answer_ignores():
    assert reasoning.judge(STATE, RIGHT, "Dragon", False, "Phoenix")["follows"] is False


def test_a_wrong_thought_followed_and_a_thought_that_states_nothing():
    wrong = " Dragon pays 1 x 0.25 = 0.25 on average. Phoenix pays 0.1 on average. "
    verdict = reasoning.judge(STATE, wrong, "Dragon", False, "Phoenix")
    assert verdict["right"] is False and verdict["follows"] is True
    assert reasoning.judge(STATE, " My moves: Dragon. ", "Dragon", False, "Phoenix") == {
        "states": False,
        "right": None,
        "follows": None,
        "success": False,
    }
