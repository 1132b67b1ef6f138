"""experiments/collapse.py: when a run's success counts as fallen."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("collapse", Path(__file__).parents[2] / "experiments" / "collapse.py")
collapse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(collapse)  # type: ignore[union-attr]


def test_noise_of_one_rollout_is_not_a_fall_and_a_lasting_drop_is() -> None:
    noisy = [0.5, 0.8, 0.55, 0.75, 0.5, 0.8, 0.6]  # one rollout of 32 swings by 0.2-0.3
    assert collapse.first_fall(noisy) is None
    falling = [0.6, 0.7, 0.8, 0.8, 0.7, 0.5, 0.3, 0.1, 0.0]
    # 3-iteration means from index 2: .70 .77 .77 .67 .50 .30 .13; .50 is .27 below the best before
    assert collapse.first_fall(falling) == 6
    assert collapse.first_fall(falling, by=0.5) == 8
    assert collapse.first_fall([0.9, 0.0]) is None  # too short for one mean before another


def test_a_recipe_names_a_sweep_or_runs() -> None:
    assert collapse.which_runs("sweep:seeds-x") == "regexp_full_match(run, 'seeds\\-x-[0-9a-f]+')"
    assert collapse.which_runs("a, b'") == "run in ('a', 'b')"
