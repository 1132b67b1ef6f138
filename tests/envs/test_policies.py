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
