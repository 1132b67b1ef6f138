"""experiments/recipes.py: recipes of the main job side by side."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("recipes", Path(__file__).parents[2] / "experiments" / "recipes.py")
recipes = importlib.util.module_from_spec(_spec)
sys.modules["recipes"] = recipes  # its dataclass looks its module up there
_spec.loader.exec_module(recipes)  # type: ignore[union-attr]


def _settings(**values: object) -> dict[str, dict[str, str]]:
    return {path.replace("__", "."): {"value": json.dumps(v), "source": "spec"} for path, v in values.items()}


def test_a_cached_step_costs_what_the_run_that_computed_it_spent() -> None:
    steps = [
        {"stage": "policy.init", "status": "ran", "seconds": 3.0},
        {"stage": "pretrain", "status": "cached", "seconds": 0.0, "computed": 150.0},
        {"stage": "warmstart", "status": "ran", "seconds": 90.0, "computed": 90.0},
        {"stage": "eval", "status": "cached", "seconds": 0.0, "computed": None},  # computed in another catalog
        {"stage": "eval", "status": "ran", "seconds": 2.5},
        {"stage": "rollout", "status": "ran", "seconds": 0.7},
        {"stage": "update", "status": "ran", "seconds": 0.4},
        {"stage": "filter", "status": "cached", "seconds": 0.0, "computed": 0.01},
    ]
    got, uncounted = recipes.by_group(steps)
    assert got == {"pretrain": 153.0, "warmstart": 90.0, "rl": 0.7 + 0.4 + 0.01, "eval": 2.5}
    assert uncounted == 1  # the eval cached from another catalog: the table says it counted 0 s


def test_a_change_is_a_recorded_setting_the_base_had_with_another_value() -> None:
    base = _settings(run__name="a", run__seed=0, warmstart__epochs=4, pretrain__steps=3000)
    other = _settings(run__name="b", run__seed=1, warmstart__epochs=6, pretrain__steps=3000, new__knob=3)
    other["new.knob"]["source"] = "default"
    # the name and the seed are not the recipe; a setting the base's code lacked, left at its default, is not a change
    assert recipes.changes(base, other) == ["warmstart.epochs=6"]
    other["new.knob"]["source"] = "-o new.knob=3"  # ... but set by the run, it is
    assert recipes.changes(base, other) == ["new.knob=3", "warmstart.epochs=6"]
    assert recipes.changes(base, base) == []
    listed = _settings(pretrain__envs=["frozenlake", "sokoban"])
    assert recipes.changes(_settings(pretrain__envs=["frozenlake"]), listed) == [
        'pretrain.envs=["frozenlake", "sokoban"]'
    ]


def test_a_mistyped_catalog_or_run_is_one_line_naming_it(tmp_path, monkeypatch, capsys) -> None:
    import pytest

    monkeypatch.setattr(sys, "argv", ["recipes.py", "--catalog", str(tmp_path / "c"), "--runs", "a"])
    with pytest.raises(SystemExit) as exc:
        recipes.run_script(recipes.main)
    assert exc.value.code == 2 and "no catalog there" in capsys.readouterr().err
    (tmp_path / "c" / "runs").mkdir(parents=True)  # a catalog holding no run
    monkeypatch.setattr(sys, "argv", ["recipes.py", "--catalog", str(tmp_path / "c"), "--runs", "nope"])
    with pytest.raises(SystemExit) as exc:
        recipes.run_script(recipes.main)
    assert "--runs: no run 'nope'" in str(exc.value)
