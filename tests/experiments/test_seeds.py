"""experiments/seeds.py: the interval over run seeds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location("seeds", Path(__file__).parents[2] / "experiments" / "seeds.py")
seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeds)  # type: ignore[union-attr]


def test_one_seed_has_no_interval_and_three_have_the_student_t_one() -> None:
    assert seeds.interval([0.9]) is None
    assert seeds.shown(None) == "- (one seed)"
    saved = json.loads((Path(__file__).parents[2] / "experiments/results/seeds-smollm2-noise25.json").read_text())
    final = [by_version[-1] for by_version in saved["data"]["success"]]  # the preset's three seeds at v20
    assert seeds.shown(seeds.interval(final)) == "[71.3, 91.5]"  # as the result file printed it
    assert any("[71.3, 91.5]" in line for line in saved["printed"])
    gains = [by_version[-1] - by_version[0] for by_version in saved["data"]["success"]]
    assert seeds.shown(seeds.interval(gains), "+") == "[-6.4, +51.2]"
