"""Agent mode end to end in one engine host: the example agents and the test programs
(`tests.stages.endpoint.programs`) against the endpoint, with Qwen2.5's tokenizer on a
tiny random-weight model, or a scripted engine where an answer must be a tool call."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

import envs
from stages.agent.loop import AGENT_FAULT, AgentConfig
from stages.agent.play import PlayJob, episode_specs
from stages.endpoint.episodes import serve_batch
from stages.endpoint.programs import ProgramConfig, python_command
from stages.engines import Completion, SamplingParams
from stages.engines.hf import HFEngine
from stages.models.policy import load_policy
from tests.fixtures.real_models import qwen25_tokenizer, smollm2_tokenizer, tiny_model
from tests.stages.engines.test_real_tokenizers import mask_runs

CHAT = "examples.agents.frozenlake_chat:play"
TOOLS = "examples.agents.frozenlake_tools:play"
PROGRAMS = "tests.stages.endpoint.programs"


class Recording:
    """An engine that remembers every prompt and completion it gave."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.tokenizer, self.calls = engine, engine.tokenizer, []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = self.engine.generate(prompts, params)
        self.calls += [(list(p), c, params) for p, c in zip(prompts, out)]
        return out


class Saying:
    """A scripted engine: every answer is `text` and the end-of-turn token."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        self.tokenizer = tokenizer
        self.ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        return [Completion(list(self.ids), [-0.5] * len(self.ids), True) for _ in prompts]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    tokenizer = qwen25_tokenizer(tools=True)
    return tokenizer, tiny_model("qwen2", tokenizer, tmp_path_factory.mktemp("qwen") / "policy")


def play(
    engine: Any,
    program: ProgramConfig,
    seeds: list[int],
    group: int,
    seed: int = 7,
    env: str = "frozenlake",
    **agent: Any,
) -> list[dict]:
    cfg = AgentConfig(**{"max_new_tokens": 8, "max_turns": 3, **agent, "program": program})
    specs = episode_specs(env, None, seeds, group)
    job = PlayJob(cfg, cfg.sampling(1.0), seed, 0)
    return serve_batch(engine, pa.Table.from_pylist([asdict(s) for s in specs]), job).to_pylist()


@pytest.fixture(scope="module")
def make_engine() -> Any:
    """How the exact-token test below builds its engine (test_vllm.py runs it with vLLM's)."""
    return HFEngine


def test_the_mask_covers_exactly_the_sampled_tokens_and_the_logprobs_are_a_forward_pass(qwen, make_engine):
    _tokenizer, policy = qwen
    engine = Recording(make_engine(policy))
    rows = play(engine, ProgramConfig(function=CHAT), [3, 4], 2)
    model, _ = load_policy(policy)
    # 4 episodes of at most 3 calls (one that falls into a hole or reaches the goal ends sooner)
    assert len(engine.calls) == sum(row["num_turns"] for row in rows) and all(0 < r["num_turns"] <= 3 for r in rows)
    for row in rows:
        ids, mask, lps = row["token_ids"], row["loss_mask"], row["logprobs"]
        assert row["segments"] == [len(ids)], "the chat loop keeps its history: one sample"
        mine = [
            (p, c)
            for p, c, _ in engine.calls
            if ids[: len(p)] == p and ids[len(p) : len(p) + len(c.token_ids)] == c.token_ids
        ]
        assert len(mine) == row["num_turns"]
        assert [(a, b) for a, b in mask_runs(mask)] == [(len(p), len(p) + len(c.token_ids)) for p, c in mine]
        assert [t for t, m in zip(ids, mask) if m] == [t for _, c in mine for t in c.token_ids]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        fresh = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        on = torch.tensor(mask[1:], dtype=torch.bool)
        assert torch.allclose(fresh[on], torch.tensor(lps[1:])[on], atol=1e-4)


def test_concurrent_episodes_stay_apart_and_a_seeded_batch_repeats(qwen):
    tokenizer, policy = qwen
    engine = HFEngine(policy)
    rows = play(engine, ProgramConfig(function=f"{PROGRAMS}:snooping"), [5, 6, 7], 2, max_turns=1)
    for row in rows:
        env = envs.make("frozenlake")
        first = env.reset(row["seed"], "train")
        assert row["turns"][0]["state"] == first  # its own lake, not a neighbour's
        assert first in tokenizer.decode(row["token_ids"])
        assert row["turns"][0]["actions"] == ["Right"] and row["num_actions"] == 1
    again = play(engine, ProgramConfig(function=f"{PROGRAMS}:snooping"), [5, 6, 7], 2, max_turns=1)
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in rows]
    assert [r["logprobs"] for r in again] == [r["logprobs"] for r in rows]
    other = play(engine, ProgramConfig(function=f"{PROGRAMS}:snooping"), [5, 6, 7], 2, seed=8, max_turns=1)
    assert [r["token_ids"] for r in other] != [r["token_ids"] for r in rows]


def test_a_rewritten_history_gives_a_sample_per_call(qwen):
    tokenizer, policy = qwen
    engine = HFEngine(policy)
    for program, calls in (("forgetful", 3), ("editing", 2)):
        for row in play(engine, ProgramConfig(function=f"{PROGRAMS}:{program}"), [1], 2):
            assert row["num_turns"] == calls and len(row["segments"]) == calls, program
            assert sum(row["segments"]) == len(row["token_ids"])
            start = 0
            for n in row["segments"]:  # every sample opens the chat afresh
                assert tokenizer.decode(row["token_ids"][start : start + 3]).startswith("<|im_start|>system")
                start += n


def test_every_fault_costs_its_episode_and_only_it(qwen):
    _tokenizer, policy = qwen
    program = ProgramConfig(function=f"{PROGRAMS}:mixed", timeout=1.0, reward=f"{PROGRAMS}:score")
    rows = play(HFEngine(policy), program, [2], 6)
    reasons = {r["sample"]: r["end_reason"] for r in rows}
    assert not reasons[0].startswith(AGENT_FAULT) and rows[0]["num_turns"] == 3
    expected = {
        1: "the program raised ValueError: the agent's own bug",
        2: "the program ran past its time limit (1 s of its own time)",
        3: "the program made no call to the endpoint",
        4: "a malformed request: messages[0].role: expected one of",
        5: "no reward: the reward function returned None",
    }
    for sample, start in expected.items():
        assert reasons[sample].startswith(f"{AGENT_FAULT}: {start}"), reasons[sample]
        assert "\n" not in reasons[sample]


@pytest.mark.parametrize("which", ["qwen2.5", "smollm2"])
def test_a_tool_calling_agent_gets_tool_calls_and_keeps_one_sample(which):
    tokenizer = qwen25_tokenizer(tools=True) if which == "qwen2.5" else smollm2_tokenizer()
    call = '<tool_call>\n{"name": "move", "arguments": {"direction": "Right"}}\n</tool_call>'
    rows = play(Saying(tokenizer, call), ProgramConfig(function=TOOLS), [1, 2], 1, max_turns=2, max_new_tokens=64)
    for row in rows:
        assert [t["actions"] for t in row["turns"]] == [["Right"], ["Right"]]
        assert row["segments"] == [len(row["token_ids"])], "the tool results extend the same sample"
        assert row["drift"] == 0, "the template re-renders the call as it was sampled"
        text = tokenizer.decode(row["token_ids"])
        assert text.count("<tool_response>") == 1 and '"name": "move"' in text
        assert all(t["format_ok"] for t in row["turns"])


def test_a_task_record_reaches_the_program_and_the_reward_function(qwen):
    """On `records`, the program is given its episode's record whole, and the reward
    function scores its result against it: the record of the episode's own seed."""
    _tokenizer, policy = qwen
    program = ProgramConfig(function=f"{PROGRAMS}:grader", reward=f"{PROGRAMS}:graded")
    rows = play(HFEngine(policy), program, [4, 9], 2, env="records", max_turns=1)
    assert [(r["seed"], r["sample"]) for r in rows] == [(4, 0), (4, 1), (9, 0), (9, 1)]
    assert [r["score"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    for row in rows:
        env = envs.make("records")
        assert row["turns"][0]["state"] == env.reset(row["seed"], "train")
        assert env.record["prompt"] in _tokenizer.decode(row["token_ids"])


def test_a_response_the_template_renders_otherwise_is_drift_and_trained_as_sampled(qwen):
    tokenizer, _ = qwen
    spaced = '<tool_call>\n{"name":"move",  "arguments": {"direction":"Up"}}\n</tool_call>'
    engine = Saying(tokenizer, spaced)
    rows = play(engine, ProgramConfig(function=TOOLS), [1], 1, max_turns=2, max_new_tokens=64)
    row = rows[0]
    assert row["drift"] > 0 and [t["actions"] for t in row["turns"]] == [["Up"], ["Up"]]
    sampled = [t for t, m in zip(row["token_ids"], row["loss_mask"]) if m]
    assert sampled == engine.ids * 2, "what is trained is what was sampled, not the re-rendered call"


def test_a_command_acts_through_the_environment_url_and_prints_its_result(qwen):
    _tokenizer, policy = qwen
    program = ProgramConfig(command=python_command(PROGRAMS), reward=f"{PROGRAMS}:score", timeout=60)
    rows = play(HFEngine(policy), program, [4], 2, max_turns=2)
    for row in rows:
        assert not row["end_reason"].startswith(AGENT_FAULT), row["end_reason"]
        assert [t["actions"] for t in row["turns"]] == [["Right"], ["Right"]]
        assert row["segments"] == [len(row["token_ids"])]


def test_a_spec_checks_the_program_fields():
    from common.config import ConfigProblem

    with pytest.raises(ConfigProblem, match="function: expected 'module:function'"):
        ProgramConfig(function="not a target")
    with pytest.raises(ConfigProblem, match="not both"):
        ProgramConfig(function="a:b", command=("x",))
    with pytest.raises(ConfigProblem, match="reward: no module 'no_such_module' on the path"):
        ProgramConfig(function=CHAT, reward="no_such_module:score")
    assert not ProgramConfig().active and ProgramConfig(command=("x",)).active
    json.dumps(asdict(ProgramConfig(function=CHAT)))  # a plain config: part of the key


AGENT_RUN = """
run: {iterations: 2, seed: 3}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}  # none demonstrated: the initial policy as version 0
  rollout: {stage: rollout}
  advantage: {stage: advantage, inputs: {trajectories: trajectories}}
  update: {stage: update}
  eval: {stage: eval, every: 2}
model:
  embedded: {hidden_size: 64, layers: 1, heads: 2, kv_heads: 1, intermediate_size: 128, vocab_size: 600}
agent: {max_turns: 2, max_new_tokens: 8, program: {function: "examples.agents.frozenlake_chat:play"}}
rollout: {env: frozenlake, n_groups: 2, group_size: 2, actors: 1}  # the program in an engine actor
advantage: {estimator: grpo}
update: {optim: {mini_batch_size: 2}}
eval: {envs: [frozenlake], episodes: 2, actors: 0}
warmstart: {demonstrator: none, episodes: 2, check_episodes: 0}
"""


def test_a_pipeline_run_trains_an_agent_program_and_its_trajectories_are_queryable(spec_file, catalog, tmp_path):
    from catalog.query import query
    from tests.conftest import run_spec

    summary, _ = run_spec(spec_file(AGENT_RUN), catalog)
    assert summary.ran >= 2 + 2 * 3 + 1
    rows = query(catalog, 'select * from trajectories order by iteration, "group", sample').to_pylist()
    assert len(rows) == 8 and {r["policy_version"] for r in rows} == {0, 1}
    assert all(r["drift"] is not None and r["num_turns"] == 2 for r in rows)
    assert all(len(r["segments"]) == 1 for r in rows)  # the chat loop keeps its history
    metrics = {r["name"] for r in query(catalog, "select distinct name from metrics").to_pylist()}
    assert {"rollout/drift_tokens", "rollout/agent_faults", "eval/drift_tokens", "actor/pg_loss"} <= metrics
    evals = query(catalog, "select count(*) n, count(distinct policy_version) v from evals").to_pylist()[0]
    assert evals["n"] == 2 * evals["v"] > 0
    from pipelines.report.page import write_report

    page = write_report(catalog, ["spec"], tmp_path / "report.html")
    assert (tmp_path / "report" / "drift.png").is_file() and "Re-tokenization drift" in page.read_text()


def test_an_edited_agent_program_or_command_changes_the_keys(tmp_path, monkeypatch):
    import sys

    from catalog.keys import canonical
    from common import code

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    agent, script = tmp_path / "my_agent.py", tmp_path / "agent.sh"
    agent.write_text("def play(task):\n    return 1\n")
    script.write_text("echo 1\n")
    configs = (ProgramConfig(function="my_agent:play"), ProgramConfig(command=("bash", "agent.sh")))
    before = [canonical(c) for c in configs]
    assert canonical(configs[0]) == before[0]  # the same code, the same key
    agent.write_text("def play(task):\n    return 2\n")
    script.write_text("echo 2\n")
    code.forget()  # a new run is a new process; this one read the old file
    assert canonical(configs[0]) != before[0] and canonical(configs[1]) != before[1]


def test_hung_programs_are_waited_for_once_not_each_in_turn():
    """Issue 93: releasing N hung program threads joined each for 5 s in turn."""
    import threading
    import time

    from stages.endpoint.episodes import _release
    from stages.endpoint.server import Gate, Slot

    gate, stop = Gate(30.0), threading.Event()
    for k in range(4):
        slot = Slot(k, None, max_calls=1)  # type: ignore[arg-type]
        slot.thread = threading.Thread(target=stop.wait, daemon=True)
        slot.thread.start()
        gate.add(slot)
    started = time.monotonic()
    _release(gate, wait=0.5)
    assert time.monotonic() - started < 1.0
    stop.set()
