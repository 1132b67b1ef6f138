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
PAYS = {"Dragon": 0.1, "Phoenix": 0.25}  # the reversed pair at the paper's odds


def test_a_right_thought_and_an_answer_that_follows_it():
    assert reasoning.judge(STATE, RIGHT, "Phoenix", True, PAYS) == {
        "states": True,
        "right": True,
        "follows": True,
        "success": True,
    }


def test_a_right_thought_the_answer_ignores():
    assert reasoning.judge(STATE, RIGHT, "Dragon", False, PAYS)["follows"] is False


def test_a_wrong_thought_followed_and_a_thought_that_states_nothing():
    wrong = " Dragon pays 1 x 0.25 = 0.25 on average. Phoenix pays 0.1 on average. "
    verdict = reasoning.judge(STATE, wrong, "Dragon", False, PAYS)
    assert verdict["right"] is False and verdict["follows"] is True
    assert reasoning.judge(STATE, " My moves: Dragon. ", "Dragon", False, PAYS) == {
        "states": False,
        "right": None,
        "follows": None,
        "success": False,
    }


def test_the_gamble_at_odds_that_make_it_the_worse_arm():
    env = reasoning.envs.make("bandit_heldout", payoffs=True, high_p=0.05)
    pays = reasoning.expectations(env, 10**12, "validation")
    assert pays == {"Trader": 0.1, "Librarian": 0.05}
    state = f"Arms: {env.order[0]}, {env.order[1]}. Which arm do you pull?"
    thought = " Librarian pays 1 x 0.05 = 0.05 on average. Trader pays 0.1 on average. "
    verdict = reasoning.judge(state, thought, "Librarian", False, pays)  # picks the gamble
    assert verdict["right"] is True and verdict["follows"] is False
    assert reasoning.judge(state, thought.replace("= 0.05", "= 0.5"), "Librarian", False, pays)["right"] is False


def test_the_script_and_the_environment_apply_one_rule():
    """Issue 93: the rule compared to 1e-9 what the prompt prints with 6 significant
    digits; ties were decided three ways; names with '-' or spaces never matched; this
    script re-implemented the rule and disagreed with it (case, ties). Now both ask
    `envs.bandit.judge`."""
    env = reasoning.envs.make("bandit", payoffs=True, odds=(0.3333333,))
    env.reset(1, "train")
    assert env.reasoning_holds(env.reasoning(), env.best) is True  # "0.333333" is what the prompt says
    odd = reasoning.envs.make("bandit", payoffs=True, names=("Red Fox", "Blue-Jay"), odds=(0.1,))
    for seed in range(4):  # both arms pay 0.1 on average: a tie, and either answer follows the thought
        odd.reset(seed, "train")
        state, thought = odd.render(), odd.reasoning() or ""
        pays = reasoning.expectations(odd, seed, "train")
        for arm in odd.order:
            assert odd.reasoning_holds(thought, arm.upper()) is True
            verdict = reasoning.judge(state, thought, arm.upper(), True, pays)
            assert verdict == {"states": True, "right": True, "follows": True, "success": True}
    import pytest

    with pytest.raises(reasoning.envs.EnvError, match="without commas"):
        reasoning.envs.make("bandit", names=("Fox, Red", "Owl"))
