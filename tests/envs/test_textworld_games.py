"""TextWorld games generated from the seed behind the text protocol (`textworld`)."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install -e '.[envs]')")

import envs
from envs.policies import make_policy, play


@pytest.fixture
def options(tmp_path):
    return {"rooms": 2, "objects": 3, "quest_length": 2, "cache": str(tmp_path / "games")}


def test_a_generated_game_is_won_by_its_walkthrough(options):
    env = envs.make("textworld", **options)
    first = env.reset(11)
    assert "Admissible commands:" in first and env.action_words and not env.done
    assert env.reset(11) == first  # the same seed, the same game (now from the cache)
    success, total, steps = play(env, make_policy("expert", 0), 11)
    assert success and env.success and env.done and total > 0 and steps <= env.budget.max_actions_per_traj


def test_actions_are_the_admissible_commands(options):
    env = envs.make("textworld", **options)
    env.reset(12)
    _, reward, done, info = env.step("dance wildly")
    assert (reward, done, info["action_valid"]) == (0.0, False, False)
    command = env.action_words[0]
    _, _, _, info = env.step(command.upper())  # matched case-insensitively
    assert info["action_valid"] and env.commands == [command]
    twin = copy.deepcopy(env)  # the same game with the commands replayed
    assert twin.render() == env.render() and twin.commands == env.commands


def test_options_are_checked(options):
    with pytest.raises(envs.EnvError, match="rooms must be >= 1"):
        envs.make("textworld", rooms=0)
    with pytest.raises(envs.EnvError, match="unknown option 'room'"):
        envs.make("textworld", room=2)


def test_making_the_environment_checks_for_textworld_without_importing_it(options, monkeypatch):
    """`pipeline validate` makes each environment to check its options: TextWorld's import
    (about 0.7 s) waits for the first reset."""
    import importlib.util
    import subprocess
    import sys

    code = "import sys, envs; envs.make('textworld', rooms=2).close(); print('textworld' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(envs.EnvError, match=r"needs textworld: pip install -e '\.\[envs\]'"):
        envs.make("textworld", **options)
