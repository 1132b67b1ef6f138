"""The score stage and `pipeline score`: a policy scored on its own eval trajectories
is its eval, exactly (every importance ratio is 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from catalog.query import query
from pipelines.cli.main import app
from tests.conftest import run_spec, spec_in
from tests.stages.conftest import TINY_MODEL_YAML

SPEC = (
    """
run: {iterations: 1, seed: 2}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  eval_start: {stage: eval, once: true, config: eval}
  score: {stage: score, inputs: {policy: policy@once, trajectories: evals@once}}
eval:
  envs: [frozenlake]
  env_options: {frozenlake: {render: local, slippery: false}}
  episodes: 12
  greedy: true
  agent: {max_new_tokens: 6, max_turns: 3}
score: {bootstrap: 200}
"""
    + TINY_MODEL_YAML
)


def test_a_policy_on_its_own_evals_is_its_eval(tmp_path: Path) -> None:
    path, catalog = spec_in(tmp_path, SPEC)
    run_spec(path, catalog)
    real = query(catalog, "select avg(success::int) s from evals where temperature > 0").column(0)[0].as_py()
    m = {r["name"]: r["value"] for r in query(catalog, "select name, value from metrics").to_pylist()}
    assert m["offpolicy/success"] == pytest.approx(real)
    assert m["offpolicy/ess"] == pytest.approx(12.0) and m["offpolicy/episodes"] == 12  # greedy rows left out
    out = CliRunner().invoke(
        app, ["score", "spec", "--policy", "0", "--on", "0", "--catalog", str(tmp_path / "catalog")]
    )
    assert out.exit_code == 0, out.output
    assert f"success {real:.1%}" in out.output and "ESS 12 of 12" in out.output
    assert "not to be trusted" in out.output  # 12 < 30
    bad = CliRunner().invoke(app, ["score", "spec", "--policy", "7", "--catalog", str(tmp_path / "catalog")])
    assert bad.exit_code == 2 and "no stored policy version 7" in bad.output
