"""The registry and the protocol every environment follows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.base import EnvError

#: served and openenv play a server; verifiers needs its package and an environment's id (tests/envs/test_verifiers_env.py)
LOCAL = [n for n in envs.names() if n not in ("served", "openenv", "verifiers")]
#: Gymnasium environments whose start does not depend on the seed (a fixed map and start)
FIXED_START = {"gym:FrozenLake-v1", "gym:CliffWalking-v1"}


def test_names_and_unknowns():
    assert {
        "bandit",
        "bandit_heldout",
        "bandit_reversed",
        "sokoban",
        "sokoban_larger",
        "sokoban_new_vocab",
        "frozenlake",
        "countdown",
        "served",
        "openenv",
    } <= set(envs.names())
    with pytest.raises(EnvError, match=r"unknown environment 'sokobn' \(did you mean 'sokoban'\?\)"):
        envs.make("sokobn")
    with pytest.raises(
        EnvError, match=r"environment 'sokoban': unknown option 'num_box' \(did you mean 'num_boxes'\?\)"
    ):
        envs.make("sokoban", num_box=2)
    with pytest.raises(EnvError, match=r"environment 'bandit': the two arms need different names"):
        envs.make("bandit", low_arm="A", high_arm="a")


@pytest.mark.parametrize("name", LOCAL)
def test_same_seed_same_episode(name):
    a, b = envs.make(name), envs.make(name)
    assert a.reset(11) == b.reset(11)
    words = a.action_words or ("1 + 2",)
    for word in list(words) * 3:
        assert a.step(word) == b.step(word)
    assert isinstance(a.instructions, str) and a.instructions


@pytest.mark.parametrize("name", [n for n in LOCAL if n not in FIXED_START])
def test_seeds_vary_the_state(name):
    env = envs.make(name)
    first = env.reset(0)
    assert any(env.reset(s) != first for s in range(1, 20))


@pytest.mark.parametrize("name", LOCAL)
def test_invalid_action_costs_nothing(name):
    env = envs.make(name)
    before = env.reset(5)
    text, reward, done, info = env.step("Jump ||| 💥")
    assert (text, reward, done) == (before, 0.0, False)
    assert info == {"success": False, "action_valid": False}


@pytest.mark.parametrize("name", LOCAL)
@settings(max_examples=60, deadline=None)
@given(actions=st.lists(st.text(max_size=30), max_size=6))
def test_arbitrary_strings_never_crash(name, actions):
    env = envs.make(name)
    env.reset(3)
    for action in actions:
        text, reward, done, info = env.step(action)
        assert isinstance(text, str) and isinstance(reward, float) and isinstance(done, bool)
        assert {"success", "action_valid"} <= set(info)
