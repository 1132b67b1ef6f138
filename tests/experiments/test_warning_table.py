"""experiments/warning_table.py: falls, the window a run's noise asks for, and how a rule's
warnings are scored against them (beside a clock)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "warning_table", Path(__file__).parents[2] / "experiments" / "warning_table.py"
)
table = importlib.util.module_from_spec(_spec)
sys.modules["warning_table"] = table  # its dataclass looks its module up
_spec.loader.exec_module(table)  # type: ignore[union-attr]


def run(name: str, success: list[float], std: list[float] | None = None) -> object:
    metrics = {i: {"rollout/success_rate": s} for i, s in enumerate(success)}
    for i, v in enumerate(std or []):
        metrics[i]["rollout/in_group_std"] = v
    return table.Run(name, "held-out", metrics)


def test_a_noisy_run_asks_for_a_longer_window_and_its_swings_are_not_falls():
    swinging = run("swing", [0.3, 0.6, 0.25, 0.6, 0.3, 0.62, 0.28, 0.6, 0.3, 0.6] * 3)  # 16 lakes an iteration
    assert swinging.window() > 3 and swinging.fall() is None
    steady = run("steady", [0.6, 0.62, 0.61, 0.6, 0.59, 0.6, 0.3, 0.1, 0.05, 0.0, 0.0])
    assert steady.window() == 3 and steady.fall() == 7  # 3-iteration means: .61 at best, .33 at 7


def test_a_warning_counts_for_the_fall_it_precedes_and_any_other_is_a_false_alarm():
    falling = run("f", [0.8] * 12 + [0.0] * 8)  # the cliff leaves the window at 3: .53 at iteration 12
    assert falling.window() == 3 and falling.fall() == 12
    calm = run("c", [0.5] * 20)
    scored = table.score([falling, calm], {"f": [5, 10, 15], "c": [3]}, lead=10)
    # 5 and 10 come 7 and 2 iterations ahead (the first sets the lead); 15 comes after it; 3 has no fall
    assert (scored["falls"], scored["warned"], scored["lead"]) == (1, 1, 7)
    assert scored["false_per_100"] == 100 * 2 / 40


def test_ragens_stop_waits_for_ten_iterations_below_a_tenth_of_the_first_std():
    std = [0.4, 0.3] + [0.03] * 9 + [0.5] + [0.03] * 10
    assert table.ragen_stop(run("r", [0.5] * len(std), std)) == [(21, "ragen_stop")]
    assert table.ragen_stop(run("q", [0.5] * 11, [0.4] + [0.05] * 10)) == []  # 0.05 is not below 0.04
