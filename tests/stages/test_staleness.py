"""Bounded staleness: a rollout wired ``policy@prev:2`` samples with the policy one
update behind, the trajectories record it, and the decoupled update corrects for it."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from catalog.query import query
from tests.conftest import run_spec, spec_in
from tests.stages.conftest import TINY_GRPO

STALE = (
    TINY_GRPO.replace("iterations: 2", "iterations: 3")
    .replace("  rollout: {stage: rollout}", "  rollout: {stage: rollout, inputs: {policy: policy@prev:2}}")
    .replace("update: {optim:", "update: {correction: decoupled, optim:")
)


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory):
    path, catalog = spec_in(tmp_path_factory.mktemp("stale"), STALE)
    run_spec(path, catalog)
    return catalog


def test_a_lagged_rollout_samples_with_the_older_policy_and_says_so(stale_run):
    rows = query(
        stale_run, "select distinct iteration, policy_version, staleness from trajectories order by 1"
    ).to_pylist()
    # iteration 0: the warm start; 1: still the warm start (two back is before the start); 2: v1 (update 0)
    assert [(r["iteration"], r["policy_version"], r["staleness"]) for r in rows] == [(0, 0, 0), (1, 0, 1), (2, 1, 1)]
    weights = query(stale_run, "select iteration, value from metrics where name = 'actor/is_weight' order by 1")
    values = weights.column("value").to_pylist()
    assert len(values) == 3 and values[0] == pytest.approx(1.0)  # iteration 0 is not stale: weight 1
    assert all(0 < v <= 2.0 for v in values)


def test_proximal_logprobs_are_recomputed_for_stale_samples_only(stale_run):
    from stages.models.batching import per_sample
    from stages.models.forward import sampled_logprobs
    from stages.models.policy import load_policy
    from stages.training.loops import proximal_logprobs

    batch_key = next(
        k for k in stale_run.result_keys() if k.startswith("advantage-") and stale_run.manifest(k)["iteration"] == 2
    )
    policy_key = next(
        k for k in stale_run.result_keys() if k.startswith("update-") and stale_run.manifest(k)["iteration"] == 1
    )
    columns = ["token_ids", "loss_mask", "logprobs", "advantages", "temperature", "segments", "staleness"]
    table = per_sample(stale_run.ref(batch_key, "batch").read(columns=columns))
    fresh = table.set_column(
        table.schema.get_field_index("staleness"), "staleness", pa.array([0] * table.num_rows, pa.int64())
    )
    policy = stale_run.ref(policy_key, "policy")
    model = load_policy(policy.local_path(), dtype="float32")[0].eval()
    assert proximal_logprobs(fresh, model, 2)["prox_logprobs"].to_pylist() == fresh["logprobs"].to_pylist()
    out = proximal_logprobs(table, model, 2)
    ids = torch.tensor([table["token_ids"][0].as_py()])
    mask = torch.tensor([table["loss_mask"][0].as_py()])
    temp = torch.tensor([table["temperature"][0].as_py()], dtype=torch.float32)
    with torch.no_grad():
        logp, _ = sampled_logprobs(model, ids, torch.ones_like(ids), mask, temp)
    expected = (logp[0] * mask[0]).tolist()
    assert out["prox_logprobs"][0].as_py() == pytest.approx(expected, abs=1e-5)
    assert out["prox_logprobs"][0].as_py() != pytest.approx(table["logprobs"][0].as_py(), abs=1e-6)
