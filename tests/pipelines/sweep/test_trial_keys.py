"""A sweep's trial is a plain run of its point: every shipped sweep's trials plan the steps
(the result keys) that `pipeline run BASE -o KEY=VALUE ...` plans for the same point under
any name, so a trial and a plain run share their results, and where their numbers differ
the cause is not the sweep (the machine is: `common/machine.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.store import Catalog
from pipelines.graph.dag import build_graph
from pipelines.graph.load import load_spec
from pipelines.graph.plan import plan
from pipelines.sweep.file import load_sweep, trial_spec

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SWEEPS = sorted(CONFIGS.rglob("sweeps/*.yaml"))


def keys(spec, catalog: Catalog) -> list[tuple[int | None, str, str]]:
    return [(s.iteration, s.node, s.key) for s in plan(spec, build_graph(spec), catalog)]


def plain(base: str, overrides: dict, name: str):
    """The spec of `pipeline run BASE -o KEY=VALUE ... -o run.name=NAME`."""
    return load_spec(base, (*(f"{k}={json.dumps(v)}" for k, v in overrides.items()), f"run.name={name}"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_a_trial_plans_the_steps_of_a_plain_run_of_its_point(path: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(CONFIGS)
    sweep = load_sweep(str(path.relative_to(CONFIGS)))
    catalog = Catalog(str(tmp_path / "catalog"))
    points = sweep.grid() if sweep.section.search == "grid" else [sweep.first_point()]
    point = points[-1]  # the last: a later seed, a later level
    overrides = sweep.overrides_of(point)
    trial = trial_spec(sweep, point, sweep.trial_id(overrides))
    assert keys(trial, catalog) == keys(plain(sweep.base, overrides, "mine"), catalog)
    if len(points) > 1:  # the adversary: another point's plain run is not the same steps
        other = plain(sweep.base, sweep.overrides_of(points[0]), "mine")
        assert keys(other, catalog) != keys(trial, catalog)
