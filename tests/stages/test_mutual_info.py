"""The mutual_info stage in a pipeline: its matched scores are the sampling
log-probabilities the rollout stored, and the `cross_scores` view holds the matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from catalog.query import query
from tests.conftest import run_spec, spec_in
from tests.stages.conftest import TINY_MODEL_YAML

SPEC = (
    """
run: {iterations: 1, seed: 3}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  rollout: {stage: rollout, inputs: {policy: policy@once}}
  mutual_info: {stage: mutual_info, inputs: {policy: policy@once}}
rollout:
  env: frozenlake
  env_options: {render: local, slippery: false}
  n_groups: 6
  group_size: 2
  actors: 0
  agent: {max_new_tokens: 6, max_turns: 2}
mutual_info: {pairs: 4}
"""
    + TINY_MODEL_YAML
)


def test_matched_scores_are_the_stored_sampling_logprobs(tmp_path: Path) -> None:
    path, catalog = spec_in(tmp_path, SPEC)
    run_spec(path, catalog)
    scores = query(catalog, "select * from cross_scores order by prompt, response").to_pylist()
    assert len(scores) == 16 and {r["run"] for r in scores} == {"spec"}
    stored = query(catalog, "select token_ids, loss_mask, logprobs from trajectories").to_pylist()
    for r in (r for r in scores if r["matched"]):
        t = stored[r["response_row"]]
        mask = np.array(t["loss_mask"])
        a = int(np.flatnonzero(mask)[0])
        b = a + int(np.argmin(mask[a:])) if (mask[a:] == 0).any() else len(mask)
        assert r["response_tokens"] == b - a
        assert r["logprob"] == pytest.approx(sum(t["logprobs"][a:b]), abs=1e-3)
    metrics = {
        r["name"]: r["value"]
        for r in query(catalog, "select name, value from metrics where name like 'template/%'").to_pylist()
    }
    assert metrics["template/pairs"] == 4 and 0 <= metrics["template/retrieval"] <= 1
    assert -1e-9 <= metrics["template/mi"] <= metrics["template/mi_max"] + 1e-9
