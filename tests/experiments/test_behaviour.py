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


def test_a_sokoban_move_is_judged_from_the_grid_against_the_solver() -> None:
    from envs.sokoban import CORNERED, WALL, Sokoban, SokobanOptions

    # the stored state of a validation room: you (on a target) below a box; Up pushes it
    state = "######\n##__##\n##__##\n##X_##\n#_S__#\n######"
    up, left, down = (behaviour.verdict(state, m) for m in ("Up", "Left", "Down"))
    assert up.kind == "sokoban" and up.label == "a box, pushed onto floor" and up.safe
    assert down.label == WALL and not down.safe and not down.toward
    assert behaviour.room(state) is not None and behaviour.room("P__G\n_O__\n____") is None  # a lake is not a room
    # every room the env draws reads back as itself, and the solver's first move is on a shortest path
    from envs.sokoban_gen import solve

    for seed in range(30):
        env = Sokoban(SokobanOptions(max_solution_steps=6))
        env.reset(seed)
        again = behaviour.room(env.render())
        assert again is not None and again.content() == env.content()
        first = solve(env.floor, env.targets, env.state, env.width)[0]  # type: ignore[index]
        assert behaviour.verdict(env.render(), first).toward is True
        label = {m: env._leads_to(m) for m in ("Left", "Down", "Right", "Up")}
        for m, said in label.items():
            v = behaviour.verdict(env.render(), m)
            assert v.label == said and v.safe == (said not in ("wall", "a box that cannot move"))
            assert (said == CORNERED) <= (v.toward is False)  # a dead push is never on a shortest path
    assert left.kind == "sokoban"
