import pyarrow as pa
import pytest
import torch

from catalog.query import query
from catalog.schemas import TRAJECTORY_SCHEMA
from catalog.store import Catalog
from common.errors import SpecError
from pipelines.graph.load import load_spec
from stages.agent.play import train_seeds
from stages.models.policy import load_policy
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO, TINY_MODEL_YAML

ROLLOUT = (
    """
run: {iterations: 2, seed: 3}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  rollout: {stage: rollout, inputs: {policy: policy}}
rollout: {env: sokoban, n_groups: 2, group_size: 2, actors: 0, agent: {max_turns: 2, max_new_tokens: 8}}
"""
    + TINY_MODEL_YAML
)


def trajectories(catalog: Catalog) -> pa.Table:
    return query(catalog, 'select * from trajectories order by iteration, "group", sample')


def test_rollout_writes_the_trajectory_schema(spec_file, catalog):
    summary, _ = run_spec(spec_file(ROLLOUT), catalog)
    assert summary.ran == 4
    keys = [k for k in catalog.result_keys() if k.startswith("rollout-")]
    ref = catalog.ref(keys[0], "trajectories")
    assert ref.read().schema.equals(TRAJECTORY_SCHEMA)
    table = trajectories(catalog).to_pylist()
    assert len(table) == 8
    for it in (0, 1):
        rows = [r for r in table if r["iteration"] == it]
        assert [r["seed"] for r in rows] == [s for s in train_seeds(3, it, 2) for _ in range(2)]
        assert rows[0]["policy_version"] == 0 and rows[0]["temperature"] == 1.0
    assert len({r["seed"] for r in table}) == 4  # new initial states every iteration
    counts = query(catalog, "select count(*) n from turns").column("n")[0].as_py()
    assert counts == sum(r["num_turns"] for r in table)
    answer = query(catalog, "select env, avg(success::int) from trajectories group by env").to_pylist()
    assert answer[0]["env"] == "sokoban"


def test_stored_logprobs_are_reproduced_by_the_saved_checkpoint(spec_file, catalog):
    run_spec(spec_file(ROLLOUT), catalog)
    row = trajectories(catalog).to_pylist()[0]
    policy = catalog.ref(row["policy_key"], "policy").local_path()
    model, _ = load_policy(policy)
    ids = torch.tensor([row["token_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float() / row["temperature"], -1)
    fresh = logp[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(row["loss_mask"][1:], dtype=torch.bool)
    assert mask.sum() > 0
    assert torch.allclose(fresh[mask], torch.tensor(row["logprobs"][1:])[mask], atol=1e-4)


def test_rerun_is_skipped_and_seeded_runs_are_identical(spec_file, catalog, tmp_path):
    path = spec_file(ROLLOUT)
    run_spec(path, catalog)
    again, _ = run_spec(path, catalog)
    assert again.ran == 0
    other = Catalog(str(tmp_path / "other"))
    run_spec(path, other)
    assert trajectories(catalog)["token_ids"].to_pylist() == trajectories(other)["token_ids"].to_pylist()
    changed, _ = run_spec(path, catalog, ("rollout.temperature=0.5",))
    assert changed.ran == 2  # only the rollouts depend on it


def test_ray_data_actors_give_the_in_process_result(spec_file, catalog, tmp_path, shared_ray):
    path = spec_file(ROLLOUT)
    run_spec(path, catalog, ("run.iterations=1",))
    on_ray = Catalog(str(tmp_path / "ray"))
    run_spec(path, on_ray, ("run.iterations=1", "rollout.actors=2"))
    local, remote = trajectories(catalog), trajectories(on_ray)
    assert remote.num_rows == 4
    # two actors sample two halves with their own seeds; one actor reproduces in-process
    one = Catalog(str(tmp_path / "one"))
    run_spec(path, one, ("run.iterations=1", "rollout.actors=1"))
    assert trajectories(one)["token_ids"].to_pylist() == local["token_ids"].to_pylist()


@pytest.mark.parametrize(
    "override, match",
    [
        ("rollout.env=sokobam", r"rollout\.env: unknown environment 'sokobam'.*did you mean 'sokoban'"),
        ("rollout.env_options={dim_rom: [7, 7]}", r"rollout\.env_options: .*unknown option 'dim_rom'"),
        ("rollout.engine=vllm2", r"rollout\.engine: unknown engine 'vllm2'"),
        ("model.embedded.heads=4", r"model\.embedded\.heads: hidden_size / heads must be a whole number >= 32"),
        ("model.path=/no/such/dir", r"model\.path: '/no/such/dir' is not a model directory"),
        ("rollout.agent.max_turn=3", r"rollout\.agent\.max_turn: unknown key.*did you mean 'max_turns'"),
        ("rollout.agent.reasoning_bonus=0.5", r"rollout\.agent\.reasoning_bonus: 'sokoban' .*no rule to judge"),
        ("rollout.agent.reasoning_bonus=-1", r"rollout\.agent\.reasoning_bonus: .*>= 0"),
    ],
)
def test_bad_rollout_settings_fail_at_load(spec_file, override, match):
    with pytest.raises(SpecError, match=match):
        load_spec(spec_file(ROLLOUT), (override,))


def test_a_reasoning_bonus_needs_a_thought_and_a_rule(spec_file):
    bandit = ("rollout.env=bandit", "rollout.env_options={payoffs: true}", "rollout.agent.reasoning_bonus=0.5")
    assert load_spec(spec_file(ROLLOUT), bandit)  # the bandit with payoffs stated has a rule
    with pytest.raises(SpecError, match=r"rollout\.agent\.reasoning_bonus: .*needs agent\.think: true"):
        load_spec(spec_file(ROLLOUT), (*bandit, "rollout.agent.think=false"))
    with pytest.raises(SpecError, match=r"rollout\.agent\.reasoning_bonus: 'bandit' .*payoffs: true"):
        load_spec(spec_file(ROLLOUT), bandit[:1] + bandit[2:])


def test_env_options_take_a_list_of_numbers(spec_file):
    spec = load_spec(spec_file(ROLLOUT), ("rollout.env=bandit", "rollout.env_options={odds: [0.05, 0.25]}"))
    assert next(n for n in spec.nodes if n.name == "rollout").config.env_options == {"odds": (0.05, 0.25)}
    with pytest.raises(SpecError, match=r"rollout\.env_options: .*odds are probabilities"):
        load_spec(spec_file(ROLLOUT), ("rollout.env=bandit", "rollout.env_options={odds: [0.05, 2]}"))


def test_seed_streams_are_disjoint():
    from stages.agent.play import validation_seeds
    from stages.warmstart import CHECK_SEED_BASE, DEMO_SEED_BASE

    train = {s for run in (0, 1, 99_999) for it in range(200) for s in train_seeds(run, it, 64)}
    val = set(validation_seeds(256))
    assert len(train) == 3 * 200 * 64 and not train & val
    assert validation_seeds(4) == validation_seeds(4) and max(val) < DEMO_SEED_BASE < CHECK_SEED_BASE


ONLINE_K = TINY_GRPO.replace("iterations: 2", "iterations: 6").replace("actors: 0,", "actors: 0, online_k: 3,")


def test_online_k_generates_once_per_k_updates_and_each_update_trains_its_slice(spec_file, catalog):
    _summary, display = run_spec(spec_file(ONLINE_K), catalog)
    status = [e.status for e in display.events if e.node == "rollout"]
    assert status == ["ran", "reused", "reused", "ran", "reused", "reused"]
    assert [e.status for e in display.events if e.node == "update"] == ["ran"] * 6
    table = trajectories(catalog).to_pylist()
    assert sorted({r["iteration"] for r in table}) == [0, 3] and len(table) == 2 * 3 * 2 * 2
    # the k x n_groups groups are those that k = 1 would play, iteration after iteration
    for first in (0, 3):
        rows = [r for r in table if r["iteration"] == first]
        assert [r["seed"] for r in rows] == [
            s for i in range(first, first + 3) for s in train_seeds(3, i, 2) for _ in range(2)
        ]
        assert {r["policy_version"] for r in rows} == {first}
    for i in range(6):
        key = next(
            k for k in catalog.result_keys() if k.startswith("advantage-") and catalog.manifest(k)["iteration"] == i
        )
        assert catalog.manifest(key)["inputs"]["trajectories"].endswith(f"/trajectories[{i % 3}/3]")
        got = catalog.ref(key, "batch").read()["seed"].to_pylist()
        assert got == [s for s in train_seeds(3, i, 2) for _ in range(2)]


def test_max_batch_plays_the_episodes_in_parts_of_that_size(tiny_policy):
    from dataclasses import asdict, replace

    from stages.agent.loop import AgentConfig
    from stages.agent.play import PlayJob, episode_specs, play_batch
    from stages.engines import SamplingParams
    from stages.engines.hf import HFEngine

    engine = HFEngine(tiny_policy)
    sizes = []
    generate = engine.generate
    engine.generate = lambda prompts, params: sizes.append(len(prompts)) or generate(prompts, params)
    items = pa.Table.from_pylist([asdict(s) for s in episode_specs("sokoban", None, [1, 2, 3], 2)])
    job = PlayJob(AgentConfig(max_turns=2, max_new_tokens=8), SamplingParams(max_new_tokens=8), 11)
    whole = play_batch(engine, items, replace(job, max_batch=4))
    assert max(sizes) <= 4 and len(sizes) >= 2
    parts = pa.concat_tables([play_batch(engine, items.slice(0, 4), job), play_batch(engine, items.slice(4), job)])
    assert whole.equals(parts)


class _Log:
    def __init__(self):
        self.lines, self.events = [], []

    def warn(self, line, metric, value):
        self.lines.append(line)
        self.events.append((metric, value))


class _Mover:
    """An engine that always answers `Right`, so that every turn steps the environment."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, params):
        from stages.engines import Completion

        ids = self.tokenizer.encode("Right</answer>", add_special_tokens=False)  # the prompt opens <answer>
        return [Completion(list(ids), [-0.1] * len(ids), True) for _ in prompts]


def test_an_episode_whose_served_env_fails_is_dropped_and_counted(tiny_policy):
    """A server that fails one request in eleven costs the episodes it broke, not the batch."""
    from dataclasses import asdict

    from stages.agent.loop import FAULT, AgentConfig
    from stages.agent.play import PlayJob, drop_faults, episode_specs, play_batch
    from stages.engines import SamplingParams
    from stages.engines.hf import HFEngine
    from tests.envs.test_served import flaky_server

    srv = flaky_server("500", every=11)
    try:
        options = {"url": srv.url, "env": "frozenlake", "timeout": 2.0, "retries": 0}
        specs = episode_specs("served", options, list(range(6)), 2)
        items = pa.Table.from_pylist([asdict(s) for s in specs])
        job = PlayJob(AgentConfig(think=False, max_turns=3, max_new_tokens=8), SamplingParams(max_new_tokens=8), 3)
        played = play_batch(_Mover(HFEngine(tiny_policy).tokenizer), items, job)
    finally:
        srv.stop()
    assert played.num_rows == 12  # one row per episode, whatever happened to it
    ends = played["end_reason"].to_pylist()
    faults = [e for e in ends if e.startswith(FAULT)]
    assert faults and len(faults) < len(ends)
    assert all("server error 500" in e and "\n" not in e for e in faults)
    assert any("/step:" in e for e in faults) and any("/create:" in e or "/reset:" in e for e in faults)
    log = _Log()
    kept, n = drop_faults(log, played, "rollout/env_failures", 0.5)
    assert n == len(faults) and kept.num_rows == 12 - n
    assert not any(e.startswith(FAULT) for e in kept["end_reason"].to_pylist())
    assert len(log.lines) == 1 and f"{int(n)} of 12 episodes dropped" in log.lines[0]
    assert log.events == [("rollout/env_failures", n)]


def test_a_broken_environment_fails_the_stage_in_one_line():
    from stages.agent.loop import fault_reason
    from stages.agent.play import drop_faults

    table = pa.table(
        {"end_reason": [fault_reason(RuntimeError("served env x: gone")), "success", fault_reason(OSError("y"))]}
    )
    with pytest.raises(
        RuntimeError,
        match=r"^2 of 3 episodes failed in their environment \(more than 0\.5 of them\); the first: served env x: gone$",
    ):
        drop_faults(_Log(), table, "eval/env_failures", 0.5)


def test_an_edited_task_record_file_changes_the_rollout_and_eval_keys(tmp_path):
    """`records` reads a file the config only names: its content is in the keys, and only
    an environment that reads a file adds anything (the other keys are as they were)."""
    import json

    from catalog.keys import canonical
    from stages.eval import EvalConfig
    from stages.rollout import RolloutConfig

    tasks = tmp_path / "tasks.jsonl"
    sums = [{"prompt": f"{n} + 1?", "answer": str(n + 1)} for n in range(16)]  # four held out for the eval
    tasks.write_text("".join(json.dumps(r) + "\n" for r in sums))
    options = {"path": str(tasks)}

    def keys() -> list[object]:
        return [
            canonical(RolloutConfig(env="records", env_options=options)),
            canonical(EvalConfig(envs=("records", "frozenlake"), env_options={"records": options})),
        ]

    before = keys()
    assert keys() == before
    tasks.write_text("".join(json.dumps(r) + "\n" for r in [{"prompt": "0 + 2?", "answer": "2"}, *sums[1:]]))
    after = keys()
    assert all(a != b for a, b in zip(after, before, strict=True))
    assert set(after[1]["env_data"]) == {"records"}
    assert "env_data" not in canonical(RolloutConfig(env="frozenlake"))
