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


def test_a_saved_seed_joins_the_catalog_s_and_one_seed_twice_is_an_error() -> None:
    """`--also`: the seeds of a saved table (its catalog gone) beside the catalog's, over
    the versions both have; the fewest episodes behind a rate is the interval's."""
    import pytest

    head = "eval success (T=0.5) by policy version, run seeds [1]"
    at = {(1, 0): 0.5, (1, 1): 0.6, (1, 11): 0.7, (1, 15): 0.7, (1, 20): 0.8}
    got = seeds._joined((head, [1], [0, 1, 11, 15, 20], at, 256), "smollm2-sokoban-s0")
    head2, both, versions, rates, episodes = got
    assert head2 == "eval success (T=0.5) by policy version, run seeds [0, 1]"
    assert both == [0, 1] and versions == [0, 1, 11, 20] and episodes == 128  # the saved table: 128 rooms, no v15
    assert rates[(0, 20)] == 0.5546875 and rates[(1, 20)] == 0.8
    with pytest.raises(SystemExit, match=r"seed\(s\) \[0\] are in the catalog's runs too"):
        seeds._joined((head, [0], [0, 20], {(0, 0): 0.1, (0, 20): 0.2}, 128), "smollm2-sokoban-s0")
    with pytest.raises(SystemExit, match="no policy version is in every table"):
        seeds._joined((head, [1], [5], {(1, 5): 0.1}, 128), "smollm2-sokoban-s0")


def test_a_saved_table_measured_at_another_temperature_or_environment_is_refused() -> None:
    """Issue 93: `--also` averaged in a table measured at another temperature; paired.py
    checked this, seeds.py did not. Both now ask `common.recording.same_measure`."""
    import pytest

    at = {(1, 0): 0.5, (1, 20): 0.8}
    for head in (
        "eval success (T=1) by policy version, run seeds [1]",
        "eval success (T=0.5, bandit) by policy version, run seeds [1]",
    ):
        with pytest.raises(SystemExit, match=r"it measured 'eval success \(T=0.5\) by policy version'"):
            seeds._joined((head, [1], [0, 20], at, 128), "smollm2-sokoban-s0")
