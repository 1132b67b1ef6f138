"""`pipeline report --sweep`: a sweep's levels overlaid, each level's seeds one band, and
a table of the levels with intervals inside 0-100% and differences paired by seed."""

from __future__ import annotations

import json
import re
import time

from typer.testing import CliRunner

from catalog.trials import TrialRecord, read_trials, write_trial
from pipelines.cli.main import app
from pipelines.report.levels import Level, table
from pipelines.sweep.tune import load_sweep, run_sweep
from tests.stages.conftest import TINY_GRPO

#: the smallest learning pipeline, evaluated after its second iteration
BASE = (
    TINY_GRPO.replace("  update: {stage: update}\n", "  update: {stage: update}\n  eval: {stage: eval, every: 2}\n")
    + "eval: {envs: [bandit], episodes: 4, agent: {max_new_tokens: 8}}\n"
)
SEEDS = """
sweep: {base: base.yaml, metric: eval/success_rate, num_samples: 2, max_concurrent_trials: 1}  # one trial process for the four
space:
  update.optim.lr: {grid: [3.0e-3, 1.0e-3]}   # the second is the base spec's
"""


def test_the_table_pairs_seeds_and_keeps_intervals_inside_0_100():
    first = Level("lr=0.001", ["a0", "a1", "a2"], [0, 1, 2], {"a0": {5: 0.676}, "a1": {5: 0.77}, "a2": {5: 0.301}}, 256)
    other = Level("lr=0.01", ["b0", "b1", "b2"], [0, 1, 2], {"b0": {5: 0.7}, "b1": {5: 0.8}, "b2": {5: 0.5}}, 256)
    rows = table([first, other])
    assert rows[0]["success at v5"] == "67.6%, 77.0%, 30.1%" and rows[0]["95% interval over seeds"] == "[9.1, 95.4]"
    assert rows[0]["difference to the first level (paired by seed)"] == "-"
    # paired: +2.4, +3.0, +19.9 points; their mean +8.4 with t over 3 differences
    assert rows[1]["difference to the first level (paired by seed)"] == "+8.4 [-16.2, +33.1]"
    low, high = (float(x) for x in re.findall(r"[\d.]+", rows[1]["95% interval over seeds"]))
    assert 0 < low < 50 < 80 < high < 100
    other.default = True  # the level with the base spec's settings is the reference wherever it stands
    rows = table([first, other])
    assert rows[1]["difference to the default (paired by seed)"] == "-"
    assert rows[0]["difference to the default (paired by seed)"] == "-8.4 [-33.1, +16.2]"


def test_a_level_missing_a_seed_is_paired_by_run_seed_not_by_position():
    ref = Level("default", ["a0", "a1", "a2"], [0, 1, 2], {"a0": {5: 0.5}, "a1": {5: 0.6}, "a2": {5: 0.7}}, 64)
    ref.default = True
    # seed 1 failed: seeds 0 and 2 are the default's own digits, so the difference is 0 (by position: +10.0)
    gap = Level("k=2", ["b0", "b2"], [0, 2], {"b0": {5: 0.5}, "b2": {5: 0.7}}, 64)
    apart = Level("k=4", ["c7"], [7], {"c7": {5: 0.9}}, 64)
    rows = table([ref, gap, apart])
    assert rows[1]["difference to the default (paired by seed)"].startswith("+0.0 ")
    assert rows[1]["difference to the default (paired by seed)"].endswith("(2 pairs)")
    assert rows[2]["difference to the default (paired by seed)"] == "- (no run seed in common)"


def test_a_run_without_an_eval_leaves_the_others_in_the_table():
    ref = Level("default", ["a0", "a1"], [0, 1], {"a0": {5: 0.5}, "a1": {5: 0.6}}, 64)
    empty = Level("k=2", [], [], {}, 64, without_eval=["b0"])
    rows = table([ref, empty])
    assert [r["level"] for r in rows] == ["default"]


def test_a_sweep_report_draws_each_level_as_the_band_of_its_seeds(spec_file, catalog, tmp_path):
    spec_file(BASE, "base.yaml")
    run_sweep(load_sweep(spec_file(SEEDS, "seeds.yaml")), catalog, lambda _: None)
    # a point run twice (a sweep resumed by an earlier version from another checkout): counted once
    first = min(read_trials(catalog.root, "seeds"), key=lambda t: t["run"])
    copy = {k: v for k, v in first.items() if k in TrialRecord.__dataclass_fields__}
    write_trial(catalog.root, TrialRecord(**(copy | {"trial": "again", "finished_at": time.time() + 60})))
    runner = CliRunner()
    out = tmp_path / "seeds.html"
    done = runner.invoke(app, ["report", "--sweep", "seeds", "--catalog", str(catalog.root.uri), "--out", str(out)])
    assert done.exit_code == 0, done.output
    page = out.read_text()
    assert "Sweep report: seeds" in page and "data:image/png;base64," in page and out.with_suffix(".png").stat().st_size
    row = re.search(
        r"<tr><td>update.optim.lr=0.001 \(the default\)</td><td>3, 4</td><td>([\d.]+)%, ([\d.]+)%</td>", page
    )
    assert row, page[:3000]
    assert "<th>difference to the default (paired by seed)</th>" in page
    assert re.search(
        r"<tr><td>update.optim.lr=0.003</td><td>3, 4</td><td>[^<]*</td><td>[^<]*</td><td>[^<]*</td><td>[+-]", page
    )
    # a point of the sweep file run again after its fixed overrides were edited: a level of its own
    edited = json.dumps(json.loads(first["overrides"]) | {"update.optim.grad_clip": 0.5}, sort_keys=True)
    write_trial(
        catalog.root, TrialRecord(**(copy | {"trial": "edited", "overrides": edited, "finished_at": time.time()}))
    )
    done = runner.invoke(app, ["report", "--sweep", "seeds", "--catalog", str(catalog.root.uri), "--out", str(out)])
    assert done.exit_code == 0 and out.read_text().count("update.optim.grad_clip=0.5") == 2  # its row, its runs
    # mistakes: one line each
    for args, said in [
        (["--sweep", "nosuch"], "no ended trial of a sweep 'nosuch'"),
        (["--sweep", "../seeds"], "a sweep name is letters"),
        (["run-x", "--sweep", "seeds"], "give run names or --sweep, not both"),
        ([], "give one or more run names"),
    ]:
        bad = runner.invoke(app, ["report", *args, "--catalog", str(catalog.root.uri)])
        assert bad.exit_code == 2 and said in bad.output and "Traceback" not in bad.output, bad.output
