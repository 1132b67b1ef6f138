"""experiments/behaviour.py: the rule that checks an eval move against the state it saw."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from envs.bandit import Bandit, BanditOptions
from envs.frozenlake import FrozenLake, FrozenLakeOptions
from envs.lake_rules import _closer

_spec = importlib.util.spec_from_file_location("behaviour", Path(__file__).parents[2] / "experiments" / "behaviour.py")
behaviour = importlib.util.module_from_spec(_spec)
sys.modules["behaviour"] = behaviour  # its dataclasses look their module up
_spec.loader.exec_module(behaviour)  # type: ignore[union-attr]


def test_a_lake_move_is_judged_as_the_state_shows_it() -> None:
    env = FrozenLake(FrozenLakeOptions(slippery=False, render="relative"))
    for seed in range(40):
        env.reset(seed)
        state = env.render()
        for action in ("Left", "Down", "Right", "Up"):
            v = behaviour.verdict(state, action)
            assert v.kind == "lake"
            assert v.safe == (action in env.safe_moves()), (state, action)
            assert v.toward == (action in _closer(env, [action])), (state, action)
            assert v.label == env._leads_to(action)


def test_a_bandit_answer_is_judged_by_its_place_in_the_state() -> None:
    env = Bandit(BanditOptions())
    env.reset(3)
    first, second = env.order
    assert behaviour.verdict(env.render(), first).first is True
    assert behaviour.verdict(env.render(), second).first is False
    assert behaviour.verdict(env.render(), second).offered == (first, second)


def test_a_thought_names_the_state_s_action_words_in_order() -> None:
    offered = ("Phoenix", "Dragon")
    assert behaviour.named(" My moves: Dragon. ", offered) == ["Dragon"]
    assert behaviour.named("Dragon pays more than Phoenix", offered) == ["Dragon", "Phoenix"]
    assert behaviour.named("I read the state and choose my next action.", offered) == []
    assert behaviour.named("Dragons", offered) == []


def test_a_state_that_is_neither_is_not_judged() -> None:
    assert behaviour.verdict("P__G\n_O__", "Left").kind == ""
