"""verifiers environments by id (`envs.verifiers_env`): the real package (0.3.1, in its own
environment: bash .ci/verifiers), a fixture environment written as its authors write one
(tests/fixtures/vf_sums.py), its own rollout played through our endpoint and scored by
its own rubric."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pytest

import envs
from catalog.query import query
from stages.agent.loop import AgentConfig
from stages.agent.play import PlayJob, episode_specs
from stages.endpoint.episodes import serve_batch
from stages.endpoint.programs import ProgramConfig
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO
from tests.stages.endpoint.test_episodes import Saying

vf = pytest.importorskip("verifiers", reason="verifiers is not installed (bash .ci/verifiers)")

PROGRAM = ProgramConfig(function="envs.verifiers_env:play", reward="envs.verifiers_env:reward", success_at=1.0)


@pytest.fixture(autouse=True)
def fixture_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "fixtures"))  # vf_sums, as if installed


def the_package_says(response: str, answer: str) -> float:
    """The fixture's own parser on an answer: 1 for the right sum in <answer> tags."""
    given = vf.XMLParser(["answer"], answer_field="answer").parse_answer([{"role": "assistant", "content": response}])
    return float(given is not None and given.strip() == answer)


def test_an_episode_is_a_row_of_the_environments_data_and_rows_are_held_out_by_prompt():
    env = envs.make("verifiers", id="vf_sums")
    data = vf.load_environment("vf_sums").get_dataset()
    for seed in (0, 7, 123):
        state = env.reset(seed)
        assert env.record == dict(data[seed % len(data)])
        assert state == f"system: {data[0]['prompt'][0]['content']}\nuser: {data[seed % len(data)]['question']}"
    train = {env.reset(s, "train") for s in range(60)}
    held = {env.reset(s, "validation") for s in range(60)}
    assert train and held and not train & held
    with pytest.raises(envs.EnvError, match=r"id 'vf_sumz': .*Could not import 'vf_sumz'"):
        envs.make("verifiers", id="vf_sumz")
    with pytest.raises(envs.EnvError, match=r"id 'vf_sums': .*unexpected keyword argument 'digitz'"):
        envs.make("verifiers", id="vf_sums", args={"digitz": 2})
    with pytest.raises(envs.EnvError, match=r"id: expected the verifiers environment's id"):
        envs.make("verifiers")


def serve(text: str, options: dict[str, Any], seeds: list[int], max_turns: int = 1) -> list[dict[str, Any]]:
    from tests.fixtures.real_models import qwen25_tokenizer

    cfg = AgentConfig(max_new_tokens=16, max_turns=max_turns, program=PROGRAM)
    specs = episode_specs("verifiers", options, seeds, 1)
    job = PlayJob(cfg, cfg.sampling(1.0), 7, 0)
    engine = Saying(qwen25_tokenizer(), text)
    return serve_batch(engine, pa.Table.from_pylist([asdict(s) for s in specs]), job).to_pylist()


def test_its_own_rollout_plays_through_the_endpoint_and_its_rubric_scores_it():
    options = {"id": "vf_sums"}
    rows = serve("<answer>7</answer>", options, list(range(12)))
    env = envs.make("verifiers", **options)
    for row in rows:
        env.reset(row["seed"], row["split"])
        assert row["end_reason"] != "agent_fault", row["end_reason"]
        assert row["num_turns"] == 1 and row["turns"][0]["response"].startswith("<answer>7</answer>")
        assert row["score"] == the_package_says("<answer>7</answer>", env.record["answer"])
        assert row["success"] == (row["score"] >= 1.0)
    assert {r["score"] for r in rows} == {0.0, 1.0}, "seeds 0..11 hold sums of 7 and others"


def test_a_multi_turn_environment_replies_and_every_call_is_a_turn():
    options = {"id": "vf_sums", "args": {"turns": 3}, "max_turns": 3}
    rows = serve("<answer>7</answer>", options, list(range(12)), max_turns=3)
    env = envs.make("verifiers", **options)
    for row in rows:
        env.reset(row["seed"], row["split"])
        right = env.record["answer"] == "7"
        # a right answer ends it at once (score 1 / 1); a wrong one hears "wrong, try again" to the last turn
        assert (row["num_turns"], row["score"]) == ((1, 1.0) if right else (3, 0.0)), row
        if not right:
            assert "wrong, try again" in row["turns"][1]["state"]


def test_an_episode_the_endpoint_ends_first_scores_0_and_is_not_a_fault():
    options = {"id": "vf_sums", "args": {"turns": 3}, "max_turns": 2}  # fewer calls than the environment takes
    rows = serve("<answer>7</answer>", options, list(range(12)), max_turns=2)
    env = envs.make("verifiers", **options)
    for row in rows:
        env.reset(row["seed"], row["split"])
        if env.record["answer"] == "7":
            assert (row["num_turns"], row["score"], row["success"]) == (1, 1.0, True)
        else:
            assert (row["num_turns"], row["score"], row["success"]) == (2, 0.0, False)
            assert not row["end_reason"].startswith("agent_fault"), row["end_reason"]


def test_a_spec_trains_an_iteration_and_the_rewards_are_the_rubrics(spec_file, catalog):
    options = json.dumps({"id": "vf_sums"})
    program = json.dumps(asdict(PROGRAM) | {"command": []})
    spec = TINY_GRPO.replace("env: bandit,", f"env: verifiers, env_options: {options},").replace(
        "agent: {max_new_tokens: 8}", f"agent: {{max_new_tokens: 8, program: {program}}}"
    )
    run_spec(spec_file(spec), catalog, ("run.iterations=1",))
    rows = query(catalog, "select seed, split, score, success, turns, end_reason from trajectories").to_pylist()
    assert rows and any(k.startswith("update-") for k in catalog.result_keys())
    env = envs.make("verifiers", id="vf_sums")
    for row in rows:
        env.reset(row["seed"], row["split"])
        assert not row["end_reason"].startswith("agent_fault"), row["end_reason"]
        assert row["score"] == the_package_says(row["turns"][-1]["response"], env.record["answer"])


def test_a_spec_that_plays_it_any_other_way_is_one_line(spec_file):
    from common.config import ConfigProblem
    from stages.rollout import RolloutConfig

    with pytest.raises(ConfigProblem, match=r"'verifiers' plays its own rollout: set agent.program.function"):
        RolloutConfig(env="verifiers", env_options={"id": "vf_sums"})


def test_other_rows_or_an_edited_environment_change_the_keys(tmp_path, monkeypatch):
    from pathlib import Path

    from common.code import forget
    from envs.registry import data_digest

    source = tmp_path / "vf_copy.py"
    text = Path(__import__("vf_sums").__file__).read_text()
    source.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    first = data_digest("verifiers", {"id": "vf-copy"})
    assert first == data_digest("verifiers", {"id": "vf-copy"})
    assert data_digest("verifiers", {"id": "vf-copy", "args": {"n": 50}}) != first  # other rows
    source.write_text(text.replace('"wrong, try again"', '"no, again"'))
    forget()
    envs.verifiers_env._LOADED.clear()
    assert data_digest("verifiers", {"id": "vf-copy"}) != first  # the same rows, edited code
