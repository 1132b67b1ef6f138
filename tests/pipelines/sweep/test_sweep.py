"""Sweeps: trial specs checked up front, trials run by Ray Tune, recorded, resumed."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from catalog.query import query
from catalog.trials import read_base
from common.errors import SpecError
from pipelines.cli.main import app
from pipelines.sweep.tune import load_sweep, outdated, recorded, run_sweep
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


BASE = TINY_GRPO

GRID = """
sweep: {base: base.yaml, metric: rollout/score_mean, max_concurrent_trials: 2}
space:
  rollout.online_k: {grid: [1, 2]}
"""
#: the same, a trial at a time: one trial process, handed from trial to trial (`reuse_actors`), where
#: two at once start two (about 8 CPU-seconds each: an interpreter importing torch and transformers)
GRID_ONE_AT_A_TIME = GRID.replace("max_concurrent_trials: 2", "max_concurrent_trials: 1")


@pytest.fixture
def sweep_file(spec_file):
    spec_file(BASE, "base.yaml")
    return lambda text: spec_file(text, "sweep.yaml")


def test_two_trial_sweep_records_queryable_trials_and_resumes(sweep_file, catalog):
    lines: list[str] = []
    sweep = load_sweep(sweep_file(GRID))
    rows = run_sweep(sweep, catalog, lines.append)
    assert [r["status"] for r in rows] == ["finished", "finished"] and all(r["iterations"] == 2 for r in rows)
    trials = query(catalog, "select trial, run, overrides, value from trials order by trial").to_pylist()
    assert sorted(json.loads(t["overrides"])["rollout.online_k"] for t in trials) == [1, 2]
    runs = query(catalog, "select run, status from runs where run like 'sweep-%' and run != 'sweep-shared'").to_pylist()
    assert sorted(r["run"] for r in runs) == sorted(t["run"] for t in trials)
    assert {r["status"] for r in runs} == {"finished"}
    # the trial with online_k 2 generated once for its two updates
    steps = query(
        catalog,
        "select s.status from steps s join trials t on s.run = t.run "
        "where s.node = 'rollout' and t.overrides like '%\"rollout.online_k\": 2%' "
        "order by s.iteration",
    ).to_pylist()
    assert [s["status"] for s in steps] == ["ran", "reused"]
    value = (
        query(
            catalog,
            "select m.value from metrics m join trials t on m.run = t.run "
            "where m.name = 'rollout/score_mean' and m.iteration = 1 and "
            "t.overrides like '%\"rollout.online_k\": 1%'",
        )
        .column(0)
        .to_pylist()
    )
    assert value == [next(r["value"] for r in rows if json.loads(r["overrides"])["rollout.online_k"] == 1)]
    lines.clear()
    again = run_sweep(sweep, catalog, lines.append)
    assert lines[0].startswith("sweep sweep: 0 trial(s) to run, 2 already recorded") and len(again) == 2
    # the same sweep from another checkout (its base spec at another path): nothing runs again
    elsewhere = Path(sweep.file).parent / "elsewhere"
    elsewhere.mkdir()
    for name in ("base.yaml", "sweep.yaml"):
        (elsewhere / name).write_text((Path(sweep.file).parent / name).read_text())
    moved = load_sweep(str(elsewhere / "sweep.yaml"))
    assert moved.trial_id(moved.overrides_of(moved.grid()[0])) != sweep.trial_id(sweep.overrides_of(sweep.grid()[0]))
    lines.clear()
    assert len(run_sweep(moved, catalog, lines.append)) == 2 and lines[0].startswith("sweep sweep: 0 trial(s) to run")
    # what the report compares the levels with: the base spec's settings
    base = read_base(catalog.root, "sweep")
    assert base is not None and base["base"] == "base.yaml" and base["settings"]["rollout.online_k"] == "1"
    assert "run.seed" not in base["settings"] and "run.name" not in base["settings"]


def test_a_sweep_whose_base_changed_runs_its_recorded_trials_again(sweep_file, catalog):
    """Resuming skips a recorded trial only where it ran what the point plans now: after the
    base spec changed (here the update's rate), every trial runs again, under the same run."""
    lines: list[str] = []
    path = Path(sweep_file(GRID_ONE_AT_A_TIME))
    first = {
        json.loads(r["overrides"])["rollout.online_k"]: r for r in run_sweep(load_sweep(str(path)), catalog, print)
    }
    base = path.parent / "base.yaml"
    base.write_text(base.read_text().replace("lr: 1.0e-3", "lr: 2.0e-3"))
    sweep = load_sweep(str(path))

    def stale() -> list[bool]:
        ended = {r["overrides"]: r for r in query(catalog, "select * from trials").to_pylist()}
        return [outdated(sweep, p, ended[recorded(sweep.overrides_of(p))], catalog) for p in sweep.grid()]

    # another run of the first point's spec as it is now: the catalog then holds that trial's new steps,
    # but the trial's run did not take them, and its record holds the old rate's result
    run_spec(str(base), catalog, ("rollout.online_k=1", "run.name=other"))
    assert stale() == [True, True]
    again = run_sweep(sweep, catalog, lines.append)
    assert lines[0].startswith("sweep sweep: 2 recorded trial(s) ran another base spec or code than this one")
    assert "2 trial(s) to run" in lines[1]
    assert {r["trial"] for r in again} == {r["trial"] for r in first.values()}
    for r in again:
        k = json.loads(r["overrides"])["rollout.online_k"]
        assert r["finished_at"] > first[k]["finished_at"] and r["status"] == "finished"
    assert stale() == [False, False]  # the catalog now holds every step the points plan
    assert query(catalog, "select count(*) n from trials").to_pylist()[0]["n"] == 2  # the old records moved aside
    moved = catalog.root.list_files("sweeps", "sweep", "superseded")
    assert sorted(moved) == sorted(f"{r['trial']}.parquet" for r in first.values())
    lines.clear()
    run_sweep(load_sweep(str(path)), catalog, lines.append)
    assert lines[0].startswith("sweep sweep: 0 trial(s) to run, 2 already recorded")


def test_optuna_search_with_early_stopping(sweep_file, catalog):
    text = """
    sweep: {base: base.yaml, search: optuna, num_samples: 2, metric: rollout/score_mean, seed: 1,
            asha: {grace_period: 1}, max_concurrent_trials: 1}
    overrides: {run.iterations: 3}
    space:
      update.optim.lr: {loguniform: [1.0e-4, 1.0e-2]}
    """
    rows = run_sweep(load_sweep(sweep_file(text)), catalog, lambda _: None)
    assert len(rows) == 2 and {r["status"] for r in rows} <= {"finished", "stopped"}
    lrs = [json.loads(r["overrides"])["update.optim.lr"] for r in rows]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and lrs[0] != lrs[1]
    assert all(json.loads(r["overrides"])["run.iterations"] == 3 for r in rows)
    # one trial at a time: no shared once-stages computed before the trials; the first trial computed them
    runs = [r["run"] for r in query(catalog, "select run from runs order by started_at").to_pylist()]
    once = query(catalog, "select run, status from steps where iteration is null order by finished_at").to_pylist()
    assert "sweep-shared" not in runs and once and once[0] == {"run": runs[0], "status": "ran"}, (runs, once)


@pytest.mark.parametrize(
    "text, match",
    [
        ("sweeep: {}\nspace: {a: {grid: [1]}}", r"sweep\.yaml: sweeep: unknown key \(did you mean 'sweep'\?\)"),
        (
            "sweep: {base: base.yaml}\nspace: {rollout.online_k: [1, 2]}",
            r"sweep\.yaml: space\.rollout\.online_k: expected one of \{grid: \.\.\., choice",
        ),
        (
            "sweep: {base: base.yaml}\nspace: {update.optim.lr: {uniform: [1, 0.1]}}",
            r"space\.update\.optim\.lr\.uniform: expected \[low, high\] with low < high",
        ),
        (
            "sweep: {base: base.yaml}\nspace: {update.optim.lr: {uniform: [0.1, 1]}}",
            r"space\.update\.optim\.lr: 'uniform' has no grid: use grid/choice values, or sweep\.search: optuna",
        ),
        (
            "sweep: {base: base.yaml}\nspace: {rollout.n_grups: {grid: [1, 2]}}",
            r"sweep\.yaml: space\.rollout\.n_grups: unknown key \(did you mean 'n_groups'\?\)",
        ),
        (
            "sweep: {base: base.yaml}\nspace: {rollout.n_groups: {grid: [1, 0]}}",
            r"sweep\.yaml: space\.rollout\.n_groups: expected an integer >= 1, got 0",
        ),
        (
            "sweep: {base: base.yaml}\nspace: {size: {grid: [{rollout.n_groups: 2}, {rollout.group_size: 0}]}}",
            r"sweep\.yaml: space\.size: rollout\.group_size: expected an integer >= 1, got 0",
        ),
        (
            "sweep: {base: base.yaml}\noverrides: {update.optim.lr: -1}\nspace: {rollout.online_k: {grid: [1]}}",
            r"sweep\.yaml: overrides\.update\.optim\.lr: expected a number > 0, got -1",
        ),
        (
            "sweep: {base: base.yaml, metric: eval/success}\nspace: {rollout.online_k: {grid: [1]}}",
            r"sweep\.yaml: sweep\.metric: no stage of base\.yaml reports 'eval/success'",
        ),
        ("sweep: {base: nobase.yaml}\nspace: {rollout.online_k: {grid: [1]}}", r"nobase\.yaml: spec file not found"),
    ],
)
def test_sweep_mistakes_are_reported_before_anything_runs(sweep_file, catalog, text, match):
    with pytest.raises(SpecError, match=match):
        run_sweep(load_sweep(sweep_file(text)), catalog, lambda _: None)
    assert not catalog.root.exists("results")
    # `pipeline validate` checks a sweep file as the sweep does, with its one line
    result = invoke("validate", sweep_file(text))
    assert result.exit_code == 2 and re.search(match, result.output) and "Traceback" not in result.output


def test_validate_checks_a_sweep_file_s_trials_and_its_overrides(sweep_file, catalog):
    path = sweep_file(GRID)
    ok = invoke("validate", path)
    assert ok.exit_code == 0 and ok.output.strip().endswith(
        f"{path}: a sweep of 2 trial(s) of {Path(path).parent / 'base.yaml'}"
    )
    bad = invoke("validate", path, "-o", "rollout.n_groups=0")
    assert (
        bad.exit_code == 2 and "sweep.yaml: overrides.rollout.n_groups: expected an integer >= 1, got 0" in bad.output
    )
    assert not catalog.root.exists("results")


def test_repeats_count_their_seeds_from_the_base_spec_s_seed(sweep_file):
    """`num_samples: 3` runs seeds run.seed, +1, +2 of the base spec (seed 3 here): it ran
    3, 1, 2, and with a base seed of 1 two trials the same."""
    sweep = load_sweep(sweep_file("sweep: {base: base.yaml, num_samples: 3}\nspace: {rollout.online_k: {grid: [1]}}"))
    seeds = [sweep.overrides_of(p).get("run.seed", sweep.base_seed) for p in sweep.grid()]
    assert seeds == [3, 4, 5]
    fixed = load_sweep(
        sweep_file(
            "sweep: {base: base.yaml, num_samples: 2}\noverrides: {run.seed: 7}\nspace: {rollout.online_k: {grid: [1]}}"
        )
    )
    assert [fixed.overrides_of(p)["run.seed"] for p in fixed.grid()] == [7, 8]


def test_a_grid_runs_seed_by_seed(sweep_file):
    """Every level at the first seed, then every level at the next: a sweep stopped part
    way has whole seeds, each seed's levels paired."""
    sweep = load_sweep(
        sweep_file("sweep: {base: base.yaml, num_samples: 2}\nspace: {rollout.online_k: {grid: [1, 2, 4]}}")
    )
    seed = sweep.base_seed
    order = [(o["rollout.online_k"], o.get("run.seed", seed)) for o in map(sweep.overrides_of, sweep.grid())]
    assert order == [(1, seed), (2, seed), (4, seed), (1, seed + 1), (2, seed + 1), (4, seed + 1)]


def test_a_signal_whose_interrupt_was_dropped_ends_the_sweep_at_tune_s_next_step():
    """A SIGTERM's `Interrupted` raised where Python drops it (a `__del__`, a weakref
    callback) left a sweep running to its end: Tune's loop now checks at every step. Ray
    Tune also pickles its callbacks, which hold the check: a `Signals` pickles without
    its handlers."""
    import signal

    import cloudpickle

    from common.errors import Interrupted
    from pipelines.run.session import Signals
    from pipelines.sweep.tune import _Recorder, _recorder

    signals = Signals()
    signals.install()
    try:
        callback = _recorder(_Recorder(None, None, print), signals.check)  # type: ignore[arg-type]
        callback.on_step_end(iteration=1, trials=[])  # nothing received: nothing raised
        cloudpickle.loads(cloudpickle.dumps(callback)).on_step_end(iteration=1, trials=[])
        signals.received = signal.SIGTERM  # as `_raise` leaves it when its interrupt is dropped
        with pytest.raises(Interrupted):
            callback.on_step_end(iteration=2, trials=[])
    finally:
        signals.restore()
