"""`pipeline diff` and the report's differences: settings with their sources, shared
steps, where curves part beyond noise, one seed played by both."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from pipelines.cli.main import app
from pipelines.report.diff import diff_runs, parting_point, render, robust_sd
from tests.conftest import run_spec, spec_in
from tests.stages.conftest import TINY_MODEL_YAML

SPEC = (
    """
run: {iterations: 3, seed: 3}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  eval_start: {stage: eval, once: true, config: eval}
  rollout: {stage: rollout, inputs: {policy: policy@once}}
  mutual_info: {stage: mutual_info, inputs: {policy: policy@once}}
rollout:
  env: frozenlake
  env_options: {render: local, slippery: false}
  n_groups: 4
  group_size: 2
  actors: 0
  agent: &agent {max_new_tokens: 6, max_turns: 2}
mutual_info: {pairs: 4}
eval: {envs: [frozenlake], episodes: 4, agent: *agent}
"""
    + TINY_MODEL_YAML
)


def test_two_runs_differ_in_one_setting(tmp_path: Path) -> None:
    path, catalog = spec_in(tmp_path, SPEC)
    run_spec(path, catalog)
    run_spec(path, catalog, ("run.name=other", "mutual_info.pairs=3"))
    d = diff_runs(catalog, "spec", "other")
    by_path = {s.path: s for s in d.settings}
    assert set(by_path) == {"run.name", "mutual_info.pairs"}
    assert (by_path["mutual_info.pairs"].a, by_path["mutual_info.pairs"].b) == ("4", "3")
    assert by_path["mutual_info.pairs"].a_source == path
    assert by_path["mutual_info.pairs"].b_source == "-o mutual_info.pairs=3"
    # the once-stages and every rollout are shared; the diagnostic parts at iteration 0
    assert d.shared_steps == 3 + 3 and d.parted == (0, "mutual_info")
    parted = {name: first for name, first, _ in d.curves}
    assert parted["template/pairs"] == 0 and parted["rollout/score_mean"] is None
    text = render(d)
    assert "they part at iteration 0, node mutual_info" in text and "frozenlake seed" in text
    assert d.machine == [] and "machines: the same kind" in text  # both ran here
    out = CliRunner().invoke(app, ["diff", "spec", "other", "--catalog", str(tmp_path / "catalog")])
    assert out.exit_code == 0 and "mutual_info.pairs: 4" in out.output
    bad = CliRunner().invoke(app, ["diff", "spec", "nope", "--catalog", str(tmp_path / "catalog")])
    assert bad.exit_code == 2 and "no run 'nope'" in bad.output
    page = CliRunner().invoke(
        app, ["report", "spec", "other", "--catalog", str(tmp_path / "catalog"), "--out", str(tmp_path / "r.html")]
    )
    assert page.exit_code == 0 and 'id="differences"' in (tmp_path / "r.html").read_text()
    # a run recorded before settings were kept: its spec's keys are compared
    record = tmp_path / "catalog" / "runs" / "other" / "run.parquet"
    table = pq.read_table(record)
    pq.write_table(table.drop_columns(["settings", "machine"]), record)
    old = {s.path: s for s in diff_runs(catalog, "spec", "other").settings}
    assert old["mutual_info.pairs"].b == "3" and old["mutual_info.pairs"].b_source == "spec"
    # ... nor its machine: nothing is claimed about it
    assert diff_runs(catalog, "spec", "other").machine is None
    assert "machines: not known" in render(diff_runs(catalog, "spec", "other"))


def test_runs_on_different_machines_say_where(tmp_path: Path) -> None:
    path, catalog = spec_in(tmp_path, SPEC)
    run_spec(path, catalog)
    run_spec(path, catalog, ("run.name=other",))
    record = tmp_path / "catalog" / "runs" / "other" / "run.parquet"
    table = pq.read_table(record)
    here = json.loads(table["machine"][0].as_py())
    assert here["cpu"] and here["threads"] >= 1 and here["torch"]  # the driver had torch loaded
    there = here | {"cpu": "Other CPU", "flags": here["flags"] + " madeup", "threads": here["threads"] + 1}
    column = table.schema.get_field_index("machine")
    pq.write_table(table.set_column(column, "machine", pa.array([json.dumps(there)])), record)
    d = diff_runs(catalog, "spec", "other")
    assert d.machine == [
        ("cpu", here["cpu"], "Other CPU"),
        ("flags", here["flags"], there["flags"]),
        ("threads", here["threads"], here["threads"] + 1),
    ]
    text = render(d)
    assert "machines that differ (3)" in text and "Other CPU" in text and here["cpu"] in text
    # a tampered record (not JSON, or not an object) is not known: no difference is claimed, nor sameness
    for junk in ("not json", "[1, 2]", ""):
        pq.write_table(table.set_column(column, "machine", pa.array([junk])), record)
        d = diff_runs(catalog, "spec", "other")
        assert d.machine is None and "machines: not known" in render(d)


def test_curves_part_where_a_step_exceeds_the_noise() -> None:
    rng = np.random.default_rng(0)
    xs = list(range(40))
    a = 1.0 + 0.05 * rng.standard_normal(40)
    b = 1.0 + 0.05 * rng.standard_normal(40)
    b[20:] += 0.5  # a step ten times the noise at 20
    first = parting_point(xs, a, b, robust_sd(a), robust_sd(b), 5, 3)
    assert first is not None and 18 <= first <= 22
    same = 1.0 + 0.05 * rng.standard_normal(40)
    assert parting_point(xs, a, same, robust_sd(a), robust_sd(same), 5, 3) is None
    assert abs(robust_sd(0.05 * rng.standard_normal(4000)) - 0.05) < 0.005
