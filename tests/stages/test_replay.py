"""Offline replay: training on stored trajectories with no generation at all."""

import pytest
import torch
from safetensors.torch import load_file

from catalog.query import query
from common.errors import SpecError, UserError
from pipelines.graph.load import load_spec
from stages.replay import pick
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO, TINY_MODEL_YAML

SOURCE = (
    """
run: {name: src, iterations: 2, seed: 3}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  rollout: {stage: rollout, inputs: {policy: policy}}
rollout: {env: bandit, n_groups: 2, group_size: 2, actors: 0, agent: {max_new_tokens: 8}}
"""
    + TINY_MODEL_YAML
)

REPLAY = (
    TINY_GRPO.replace("iterations: 2", "name: rep, iterations: 3")
    .replace("rollout: {stage: rollout}", "rollout: {stage: replay}")
    .replace(
        "rollout: {env: bandit, n_groups: 2, group_size: 2, actors: 0, agent: {max_new_tokens: 8}}",
        "rollout: {run: src, n_groups: 3}",
    )
    .replace("mini_batch_size: 4, micro_batch_size: 4", "mini_batch_size: 6, micro_batch_size: 6")
)


@pytest.fixture
def stored(spec_file, catalog):
    run_spec(spec_file(SOURCE, "source.yaml"), catalog)
    return catalog


def _policy(catalog, prefix, iteration):
    key = next(
        k for k in catalog.result_keys() if k.startswith(prefix) and catalog.manifest(k)["iteration"] == iteration
    )
    return load_file(str(catalog.ref(key, "policy").local_path() / "model.safetensors"))


def _batches(catalog):
    keys = sorted((catalog.manifest(k)["iteration"], k) for k in catalog.result_keys() if k.startswith("replay-"))
    return [catalog.ref(k, "trajectories").read() for _, k in keys]


def test_replay_trains_on_stored_trajectories_without_generating(stored, spec_file):
    _summary, display = run_spec(spec_file(REPLAY), stored)
    assert {e.node: e.status for e in display.events if e.node in ("model", "warmstart")} == {
        "model": "cached",
        "warmstart": "cached",
    }
    assert not any(k.startswith("rollout-") and stored.manifest(k)["run"] == "rep" for k in stored.result_keys())
    assert [e.status for e in display.events if e.node == "update"] == ["ran"] * 3
    before, after = _policy(stored, "warmstart-", None), _policy(stored, "update-", 2)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    source = query(stored, 'select iteration, "group", token_ids from trajectories order by 1, 2, sample')
    groups = [(r["iteration"], r["group"]) for r in source.to_pylist()]
    pool = sorted(set(groups))  # 4 stored groups, replayed 3 per iteration, cycling
    batches = _batches(stored)
    for i, batch in enumerate(batches):
        assert batch["group"].to_pylist() == [g for g in range(3) for _ in range(2)]
        assert set(batch["policy_version"].to_pylist()) == {0}  # as sampled, not re-generated
        expected = [pool[u] for u in pick(4, 3, i, 3, False)]
        got = list(zip(batch["iteration"].to_pylist()[::2], batch["seed"].to_pylist()[::2]))
        seeds = {
            (r["iteration"], r["group"]): r
            for r in query(stored, 'select distinct iteration, "group", seed from trajectories').to_pylist()
        }
        assert got == [(it, seeds[(it, g)]["seed"]) for it, g in expected]
    stored_ids = {tuple(r["token_ids"]) for r in source.to_pylist()}
    assert all(tuple(ids) in stored_ids for b in batches for ids in b["token_ids"].to_pylist())


def test_replay_where_selects_trajectories(stored, spec_file):
    run_spec(
        spec_file(REPLAY),
        stored,
        ("rollout.where=iteration >= 1 and sample = 0", "run.iterations=1", "advantage.estimator=reinforce_pp"),
    )
    (batch,) = _batches(stored)
    assert batch["iteration"].to_pylist() == [1, 1, 1] and batch["sample"].to_pylist() == [0, 0, 0]
    assert batch["group"].to_pylist() == [0, 1, 2]  # two stored groups of one, the first seen twice


def test_pick_cycles_and_shuffles_per_pass():
    assert [pick(4, 3, i, 0, False) for i in range(3)] == [[0, 1, 2], [3, 0, 1], [2, 3, 0]]
    first, second = pick(5, 5, 0, 7, True), pick(5, 5, 1, 7, True)
    assert sorted(first) == sorted(second) == list(range(5)) and first != second


@pytest.mark.parametrize(
    "override, match",
    [
        ("rollout.run=srx", r"rollout\.run: no run 'srx' in catalog .*did you mean 'src'"),
        ("rollout.where=score > 99", r"rollout\.where: 'score > 99' selects none of the 8 stored trajectories"),
        ("rollout.where=no_such_column", r"rollout\.where: 'no_such_column': .*no_such_column"),
        (
            "rollout.run=null -o rollout.key=rollout-0000000000000000",
            r"rollout\.key: no stored result 'rollout-0000000000000000'",
        ),
        ("rollout.key=rollout-0000000000000000", r"rollout\.key: give run or key, not both"),
        ("rollout.run=null", r"rollout\.run: give the trajectories to replay"),
    ],
)
def test_replay_source_errors_name_the_key(stored, spec_file, override, match):
    from pipelines.graph.dag import build_graph
    from pipelines.graph.plan import plan

    with pytest.raises(SpecError, match=match):
        spec = load_spec(spec_file(REPLAY), tuple(override.split(" -o ")))
        plan(spec, build_graph(spec), stored)


def test_replay_refuses_another_tokenizer(stored, spec_file):
    other = REPLAY.replace("vocab_size: 600", "vocab_size: 700")
    with pytest.raises(
        UserError,
        match=r"rollout: the replayed trajectories were sampled by policy "
        r"'warmstart-\w+' with tokenizer \w+, but the policy being trained",
    ):
        run_spec(spec_file(other), stored)
    assert not any(k.startswith("replay-") for k in stored.result_keys())


def test_replay_checks_the_tokenizer_of_the_policy_that_sampled_what_it_reads(stored, spec_file):
    """The sampling policy is read only for its tokenizer, outside the step's checked
    inputs: its tokenizer's bytes are checked against its manifest all the same."""
    from pathlib import Path

    key = next(k for k in stored.result_keys() if k.startswith("warmstart-"))
    path = Path(stored.root.path("results", key, "policy", "tokenizer.json"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the SHA-256 tells
    path.write_bytes(bytes(data))
    from common.errors import CatalogError
    from stages.replay import checked_tokenizer

    with pytest.raises(CatalogError, match=rf"result {key}: policy/tokenizer.json differs from what was committed"):
        checked_tokenizer(stored.ref(key, "policy"))
    _summary, display = run_spec(spec_file(REPLAY), stored)  # here it is also the run's input: computed again
    assert any(key in w and "computing it again" in w for w in display.warnings)
