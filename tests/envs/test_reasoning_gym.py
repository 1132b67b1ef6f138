"""reasoning-gym tasks as environments (`envs.reasoning_gym`): the real package, its own
scorer the judge of every answer."""

from __future__ import annotations

import json

import pytest

import envs
from catalog.query import query
from catalog.store import Catalog
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO

reasoning_gym = pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("task", ["leg_counting", "basic_arithmetic", "mini_sudoku"])
def test_the_reward_is_the_packages_score_of_the_answer(task):
    env = envs.make("reasoning_gym", task=task)
    data = reasoning_gym.create_dataset(task, seed=0, size=envs.reasoning_gym.SIZE)
    for seed in range(6):
        state = env.reset(seed)  # no split: no draw again past a held-out problem
        entry = env.entry
        assert state == entry["question"] and entry == data[seed]  # the package's item of that seed
        for answer in (entry["answer"], f"I think {entry['answer']}", "no idea"):
            env.reset(seed)
            _, reward, done, info = env.step(answer)
            assert done and reward == data.score_answer(answer, entry) and info["success"] == (reward >= 1.0)


def test_problems_are_held_out_by_content_and_mistakes_are_one_line():
    env = envs.make("reasoning_gym", task="basic_arithmetic", config={"min_terms": 2, "max_terms": 3})
    train = {env.reset(s, "train") for s in range(40)}
    held = {env.reset(s, "validation") for s in range(40)}
    assert train and held and not train & held
    with pytest.raises(
        envs.EnvError, match=r"task 'leg_countin': not a reasoning-gym task \(did you mean 'leg_counting'"
    ):
        envs.make("reasoning_gym", task="leg_countin")
    with pytest.raises(envs.EnvError, match=r"task 'basic_arithmetic' config: .*min_termz"):
        envs.make("reasoning_gym", task="basic_arithmetic", config={"min_termz": 2})
    with pytest.raises(envs.EnvError, match="without seed or size"):
        envs.make("reasoning_gym", task="leg_counting", config={"seed": 3})


def test_an_iteration_trains_on_a_task_and_its_rewards_are_the_packages(spec_file, catalog: Catalog):
    options = {"task": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2}}
    spec = TINY_GRPO.replace("env: bandit,", f"env: reasoning_gym, env_options: {json.dumps(options)},")
    run_spec(spec_file(spec), catalog, ("run.iterations=1",))
    rows = query(catalog, "select seed, split, score, turns from trajectories").to_pylist()
    assert rows and any(k.startswith("update-") for k in catalog.result_keys())
    data = reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=envs.reasoning_gym.SIZE, **options["config"])
    env = envs.make("reasoning_gym", **options)
    for row in rows:
        env.reset(row["seed"], row["split"])
        (turn,) = row["turns"]
        answer = turn["actions"][0] if turn["actions"] else None
        expected = data.score_answer(answer, env.entry) if answer else turn["reward"]  # no answer: the format penalty
        assert row["score"] == pytest.approx(expected)


@pytest.mark.parametrize("name, options", [("reasoning_gym", {"task": "basic_arithmetic"}), ("records", {})])
def test_the_expert_gives_the_reference_and_random_valid_another_questions_answer(name, options):
    from envs.policies import make_policy

    expert, noise = make_policy("expert"), make_policy("random_valid", seed=3)
    env = envs.make(name, **options)
    others = []
    for seed in range(12):
        env.reset(seed)
        answer = expert(env)
        assert env.step(answer)[1:3] == (1.0, True) and env.success, "the reference answer scores in full"
        env.reset(seed)
        others.append(noise(env) != answer)
    assert sum(others) >= 8, "the noise answers mostly another question's answer"


def test_random_valid_without_reference_answers_is_one_line(tmp_path):
    from envs.base import EnvError
    from envs.policies import make_policy

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    env = envs.make("records", path=str(path))
    env.reset(0)
    with pytest.raises(EnvError, match="no random answer for environment 'records'"):
        make_policy("random_valid")(env)
    with pytest.raises(EnvError, match="no expert policy for environment 'records'"):
        make_policy("expert")(env)
