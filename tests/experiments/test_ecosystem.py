"""experiments/ecosystem.py: the rules beside the reasoning-gym preset, scored by the environment."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

spec = importlib.util.spec_from_file_location(
    "ecosystem", Path(__file__).resolve().parents[2] / "experiments" / "ecosystem.py"
)
assert spec is not None and spec.loader is not None
ecosystem = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ecosystem)

OPTIONS = {
    "task": "basic_arithmetic",
    "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"]}
    | {"allow_negation": False, "allow_parentheses": False},
}


def test_the_rules_are_scored_by_the_task_on_the_evals_held_out_problems():
    rates = ecosystem.rule_rates(OPTIONS, 32)
    assert rates["the reference answer (expert)"] == 1.0
    # adding is right on the sums and wrong on most differences: between none and all
    assert 0.2 < rates["add the numbers, whatever the operator"] < 0.8
    assert rates["the first number"] < rates["add the numbers, whatever the operator"]
    assert 1 < ecosystem.distinct(OPTIONS, 32) <= 32


def test_the_numbers_of_a_question_are_read_as_written():
    assert ecosystem._numbers("Calculate 7 - 13.") == [7, 13]
