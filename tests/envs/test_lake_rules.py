"""The FrozenLake comparators: text-only rules read only the text, greedy_safe never
steps into a hole, and the random policy's exact success matches sampling."""

from __future__ import annotations

import random

import pytest

import envs
from envs.frozenlake import MOVES, move
from envs.lake_rules import RULES, TEXT_RULES, greedy_safe, random_success, toward_goal
from envs.policies import play, random_valid


class TextOnly:
    """An object with nothing but the observation text (any other attribute fails)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def render(self) -> str:
        return self.text


@pytest.mark.parametrize("render", ["local", "relative", "grid", "positions"])
@pytest.mark.parametrize("name", sorted(TEXT_RULES))
def test_a_text_rule_reads_only_the_text(name, render):
    env = envs.make("frozenlake", slippery=False, render=render)
    for seed in range(20):
        env.reset(seed)
        a, b = TEXT_RULES[name](seed)(env), TEXT_RULES[name](seed)(TextOnly(env.render()))
        assert a == b and a in MOVES


def test_copy_goal_word_copies_on_local_and_guesses_on_relative():
    local = envs.make("frozenlake", slippery=False, render="local")
    relative = envs.make("frozenlake", slippery=False, render="relative")
    for seed in range(30):
        local.reset(seed)
        relative.reset(seed)
        goal_line = local.render().splitlines()[0]
        assert TEXT_RULES["copy_goal_word"](seed)(local) in goal_line
        assert not any(m in relative.render().splitlines()[0] for m in MOVES)  # the goal line has no action word


def test_greedy_safe_never_steps_into_a_hole_when_it_can_avoid_it():
    env = envs.make("frozenlake", slippery=False, render="grid")
    for seed in range(200):
        env.reset(seed)
        action = greedy_safe(seed)(env)
        can_avoid = any(move(env.pos, a, env.size) not in env.holes for a in MOVES)
        assert not can_avoid or move(env.pos, action, env.size) not in env.holes


def test_toward_goal_gets_closer_even_into_a_hole():
    env = envs.make("frozenlake", slippery=False, render="grid")
    into_hole = 0
    for seed in range(200):
        env.reset(seed)
        (r, c), (gr, gc) = env.pos, env.goal
        after = move(env.pos, toward_goal(seed)(env), env.size)
        assert abs(after[0] - gr) + abs(after[1] - gc) == abs(r - gr) + abs(c - gc) - 1
        into_hole += after in env.holes
    assert into_hole > 0  # it does not read the holes: that is what greedy_safe adds


def test_random_success_is_exact():
    env = envs.make("frozenlake", slippery=False)
    rng = random.Random(0)
    for seed in range(5):
        env.reset(seed)
        exact = random_success(env, 5)
        wins = sum(play(env, random_valid(rng.randrange(10**9)), seed, 5)[0] for _ in range(4000))
        assert abs(wins / 4000 - exact) < 0.03, (seed, exact, wins / 4000)


def test_random_success_on_slippery_lakes_is_the_mean_over_slips():
    """A slippery lake's slips are drawn from its seed, so one seed's plays share them;
    over many seeds the exact value (an expectation over slips) is the mean."""
    env = envs.make("frozenlake", slippery=True)
    rng = random.Random(0)
    exact, sampled = 0.0, 0.0
    seeds = range(400)
    for seed in seeds:
        env.reset(seed)
        exact += random_success(env, 5)
        sampled += sum(play(env, random_valid(rng.randrange(10**9)), seed, 5)[0] for _ in range(10)) / 10
    assert abs(exact - sampled) / len(seeds) < 0.03


def test_every_rule_plays_a_lake():
    env = envs.make("frozenlake", slippery=False, render="relative")
    for name, make in RULES.items():
        assert play(env, make(1), 3, 5)[2] >= 1, name


def test_sokoban_text_rules_read_only_the_relative_view() -> None:
    from envs.sokoban_rules import avoid_corners, open_moves, take_labelled_push

    env = envs.make("sokoban", render="relative", dim_room=(4, 6))
    env.floor, env.targets = frozenset({7, 8, 9, 10, 13, 14, 15, 16}), (10,)
    env.player, env.boxes = 7, {9}  # you, floor, box, target on the top row: no push lands yet
    seen = {open_moves(s)(TextOnly(env.render())) for s in range(20)}
    assert seen == {"Right", "Down"}
    env.player = 8
    assert take_labelled_push(0)(TextOnly(env.render())) == "Right"
    env.boxes = {10}  # the box is on its target: nothing is labelled a push onto one
    assert take_labelled_push(0)(TextOnly(env.render())) in {"Right", "Down", "Left"}
    env.player, env.boxes = 14, {15}  # Right pushes the box into the bottom-right corner (not the target)
    assert env.render().endswith("Right: a box, pushed into a corner.")
    assert {open_moves(s)(TextOnly(env.render())) for s in range(20)} == {"Up", "Left", "Right"}
    assert {avoid_corners(s)(TextOnly(env.render())) for s in range(20)} == {"Up", "Left"}
