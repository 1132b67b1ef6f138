"""Gymnasium's toy-text environments behind the text protocol (`gym:<id>`)."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("gymnasium", reason="gymnasium is not installed (pip install -e '.[envs]')")

import envs
from envs.gym_text import plain
from envs.policies import make_policy, play


def test_ansi_renderings_become_plain_text_with_marks():
    assert plain("\n\x1b[41mS\x1b[0mFFF\nFHFH\n") == "[S]FFF\nFHFH"
    assert plain("|\x1b[34;1mR\x1b[0m: |\x1b[43m \x1b[0m:|\x1b[35mY\x1b[0m|") == "|{R}: |[ ]:|<Y>|"


@pytest.mark.parametrize(
    "name,words",
    [
        ("gym:FrozenLake-v1", ("Left", "Down", "Right", "Up")),
        ("gym:Taxi-v4", ("South", "North", "East", "West", "Pickup", "Dropoff")),
        ("gym:CliffWalking-v1", ("Up", "Right", "Down", "Left")),
    ],
)
def test_the_protocol_holds(name, words):
    env = envs.make(name)
    assert env.name == name and env.action_words == words
    first = env.reset(3)
    assert first == envs.make(name).reset(3) and "\x1b" not in first  # seeded, plain
    assert words[0] in env.instructions
    _, reward, done, info = env.step("Jump")
    assert (reward, done, info["action_valid"]) == (0.0, False, False) and env.render() == first
    _, _, _, info = env.step(words[1].lower())
    assert info["action_valid"] and "success" in info
    twin = copy.deepcopy(env)
    assert twin.render() == env.render()


@pytest.mark.parametrize(
    "name,options", [("gym:FrozenLake-v1", {"is_slippery": False}), ("gym:Taxi-v4", {}), ("gym:CliffWalking-v1", {})]
)
def test_the_expert_is_optimal_and_random_is_not(name, options):
    env = envs.make(name, **options)
    limit = env.budget.max_actions_per_traj
    expert = [play(envs.make(name, **options), make_policy("expert", s), s, limit)[0] for s in range(10)]
    rand = [play(envs.make(name, **options), make_policy("random_valid", s), s, limit)[0] for s in range(10)]
    assert all(expert) and sum(rand) < len(rand)


def test_unknown_ids_and_options_are_one_line_errors():
    with pytest.raises(envs.EnvError, match=r"gym:FrozenLak-v1.*FrozenLake"):
        envs.make("gym:FrozenLak-v1")
    with pytest.raises(envs.EnvError, match=r"gym:FrozenLake-v1': bad option"):
        envs.make("gym:FrozenLake-v1", slippery=True)
    with pytest.raises(envs.EnvError, match="only discrete actions"):
        envs.make("gym:MountainCarContinuous-v0")
