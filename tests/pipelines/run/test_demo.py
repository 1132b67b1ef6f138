"""The demo pipeline (tests/fixtures: REINFORCE on the bi-arm bandit) learns the better arm."""

from __future__ import annotations

from pathlib import Path

from catalog.query import query
from tests.conftest import run_spec

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo.yaml"


def test_default_spec_learns_the_high_ev_arm(catalog):
    summary, _ = run_spec(str(DEMO), catalog)
    assert summary.ran == 41
    p = query(catalog, "select iteration, value from metrics where name = 'actor/p_high' order by iteration")
    values = p.column("value").to_pylist()
    assert values[0] < 0.6 and values[-1] > 0.9
    rate = query(catalog, "select iteration, avg((arm = 'Dragon')::int) r from demo_pulls group by 1 order by 1")
    rates = rate.column("r").to_pylist()
    assert rates[-1] > rates[0] + 0.3
