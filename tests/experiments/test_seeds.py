"""experiments/seeds.py: the interval over run seeds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location("seeds", Path(__file__).parents[2] / "experiments" / "seeds.py")
seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeds)  # type: ignore[union-attr]


def test_one_seed_has_no_interval_and_three_have_the_one_the_result_file_printed() -> None:
    from pipelines.report.intervals import mean_interval, rate_interval

    assert rate_interval([0.9], 256) is None and mean_interval([0.9]) is None
    assert seeds.shown(None) == "- (one seed)"
    saved = json.loads((Path(__file__).parents[2] / "experiments/results/seeds-smollm2-noise25.json").read_text())
    episodes = saved["data"]["episodes"]
    final = [by_version[-1] for by_version in saved["data"]["success"]]  # the preset's three seeds at v20
    assert seeds.shown(rate_interval(final, episodes)) == "[68.8, 90.0]"  # t on the logits, as the file printed it
    assert any("[68.8, 90.0]" in line for line in saved["printed"])
    gains = [by_version[-1] - by_version[0] for by_version in saved["data"]["success"]]
    assert seeds.shown(mean_interval(gains), "+") == "[-6.4, +51.2]"  # t on the differences
    assert saved["data"]["measured"]["command"].startswith("python experiments/seeds.py --catalog")


def test_a_saved_table_is_printed_again_from_its_rates(tmp_path, monkeypatch, capsys) -> None:
    """`--from-saved`: the same lines as the result file, from its data alone."""
    import sys

    monkeypatch.setattr(sys, "argv", ["experiments/seeds.py", "--from-saved", "seeds-starpo"])
    seeds.main()
    printed = capsys.readouterr().out.splitlines()
    saved = json.loads((Path(__file__).parents[2] / "experiments/results/seeds-starpo.json").read_text())
    assert printed == saved["printed"] and "| 90 | 80.5% | 86.7% | 80.9% | 82.7% | [71.8, 90.2] |" in printed
