"""Scripted policies: experts solve what can be solved; random is a weak baseline."""

from __future__ import annotations

import pytest

import envs
from envs.base import EnvError
from envs.policies import make_policy, play


@pytest.mark.parametrize(
    "name,expert_min,random_max",
    [
        ("bandit", 1.0, 0.7),
        ("bandit_reversed", 1.0, 0.7),
        ("sokoban", 1.0, 0.3),
        ("sokoban_larger", 1.0, 0.3),
        ("countdown", 1.0, 0.2),
        ("frozenlake", 0.35, 0.35),
    ],
)
def test_expert_beats_random(name, expert_min, random_max):
    seeds = range(120)
    env = envs.make(name)
    expert = sum(play(env, make_policy("expert", s), s)[0] for s in seeds) / len(seeds)
    rand = sum(play(env, make_policy("random_valid", s), s)[0] for s in seeds) / len(seeds)
    assert expert >= expert_min and rand <= random_max and expert > rand


def test_random_valid_only_emits_valid_actions():
    for name in ("sokoban", "frozenlake", "bandit", "countdown"):
        env = envs.make(name)
        policy = make_policy("random_valid", 0)
        env.reset(2)
        for _ in range(5):
            if env.done:
                break
            assert env.step(policy(env))[3]["action_valid"]


def test_unknown_policy():
    with pytest.raises(EnvError, match="unknown scripted policy 'greedy'"):
        make_policy("greedy")


def test_random_safe_never_enters_a_hole_or_the_edge_but_ignores_the_goal():
    from envs.frozenlake import move

    env = envs.make("frozenlake", slippery=False, render="relative")
    holes = won = toward = moves = 0
    for seed in range(200):
        policy = make_policy("random_safe", seed)
        env.reset(seed)
        for _ in range(5):  # the default's budget
            if env.done:
                break
            before, goal = env.pos, env.goal
            action = policy(env)
            after = move(before, action, env.size)
            safe_exists = any(
                move(before, a, env.size) not in env.holes and move(before, a, env.size) != before
                for a in ("Left", "Down", "Right", "Up")
            )
            if safe_exists:
                assert after not in env.holes and after != before
            toward += abs(after[0] - goal[0]) + abs(after[1] - goal[1]) < abs(before[0] - goal[0]) + abs(
                before[1] - goal[1]
            )
            moves += 1
            env.step(action)
            holes += env.pos in env.holes
        won += env.success
    assert 0.3 < toward / moves < 0.7  # a walker, not a goal-seeker
    assert 0.1 < won / 200 < 0.5 and holes == 0  # a lake always leaves a safe move
    # elsewhere (the bandit) it is random_valid
    bandit = envs.make("bandit")
    bandit.reset(3)
    assert make_policy("random_safe", 1)(bandit) in bandit.action_words


def test_random_safe_on_sokoban_never_bumps_nor_corners_a_box_but_rarely_solves():
    """Checked on the room itself, not through the view's labels: every move changes the
    state, no box ends in a corner off its target, and the walker solves far fewer rooms
    than the expert (it ignores the target)."""
    env = envs.make("sokoban", render="relative", max_solution_steps=6)
    won = 0
    for seed in range(150):
        policy = make_policy("random_safe", seed)
        env.reset(seed)
        for _ in range(8):
            if env.done:
                break
            before = env.state
            env.step(policy(env))
            assert env.state != before, f"room {seed}: a bump"
            corners = [b for b in env.boxes if b not in env.targets and env._corner(b)]
            assert not corners, f"room {seed}: a box in a corner"
        won += env.success
    expert = sum(play(env, make_policy("expert", s), s, 8)[0] for s in range(150))
    assert 0 < won < 0.6 * expert
