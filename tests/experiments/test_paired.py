"""experiments/paired.py: eval episodes paired across two policy versions, McNemar's exact test."""

from __future__ import annotations

import importlib.util
import json
import sys
from math import comb
from pathlib import Path

import duckdb
import pytest

_spec = importlib.util.spec_from_file_location("paired", Path(__file__).parents[2] / "experiments" / "paired.py")
paired = importlib.util.module_from_spec(_spec)
sys.modules["paired"] = paired  # its dataclass looks its module up
_spec.loader.exec_module(paired)  # type: ignore[union-attr]


def test_mcnemar_exact_is_the_two_sided_binomial_on_the_discordant_pairs() -> None:
    assert paired.mcnemar_exact(0, 0) == 1.0  # nothing moved
    assert paired.mcnemar_exact(5, 0) == paired.mcnemar_exact(0, 5) == 2 / 32
    assert paired.mcnemar_exact(10, 10) == 1.0  # capped: both tails overlap
    # seed 1's Sokoban rooms, v0 -> v20: 17 gained, 7 lost
    assert paired.mcnemar_exact(17, 7) == pytest.approx(2 * sum(comb(24, i) for i in range(8)) / 2**24)
    assert 0.063 < paired.mcnemar_exact(17, 7) < 0.065
    assert paired.mcnemar_exact(4, 13) == paired.mcnemar_exact(13, 4) < 0.05  # seed 2: 4 gained, 13 lost


def _evals(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    con.execute(
        "create table evals (run varchar, policy_version bigint, env varchar, env_options varchar, seed bigint, "
        "sample bigint, success boolean, temperature double)"
    )
    con.executemany("insert into evals values (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute("create table runs (run varchar, seed bigint)")
    con.execute("insert into runs values ('r1', 1), ('r2', 2)")


def test_episodes_pair_on_room_and_sample_and_a_room_missing_at_one_version_is_left_out() -> None:
    con = duckdb.connect()
    ok = {"a": (True, True), "b": (False, True), "c": (True, False), "d": (False, False)}
    rows = []
    for room, (at0, at5) in enumerate(ok.values()):
        rows += [("r1", 0, "sokoban", "{}", room, 0, at0, 0.5), ("r1", 5, "sokoban", "{}", room, 0, at5, 0.5)]
    rows += [("r1", 0, "sokoban", "{}", 99, 0, True, 0.5)]  # evaluated at v0 only
    rows += [("r1", 5, "sokoban", "{}", 0, 0, False, 1.0)]  # another temperature
    rows += [("r2", 0, "sokoban", "{}", 0, 0, False, 0.5), ("r2", 5, "sokoban", "{}", 0, 0, True, 0.5)]
    _evals(con, rows)
    sql = paired.PAIRS.format(which="run like 'r%'", temperature=0.5, env="", a=0, b=5)
    got = con.execute(sql).to_arrow_table().to_pylist()
    runs, total = paired.tally(got)
    assert vars(runs[1, "r1"]) == {"both": 1, "gained": 1, "lost": 1, "neither": 1}
    assert vars(runs[2, "r2"]) == {"both": 0, "gained": 1, "lost": 0, "neither": 0}
    assert total.pairs == 5 and total.gained == 2 and not any(r["extra"] for r in got)
    assert paired._row("all", total) == "| all | 5 | 1 | 2 | 1 | 1 | +20.0 | 1.000 |"
    # runs on the same rooms pooled: no McNemar p, which would treat shared rooms as independent pairs
    assert paired._row("all", total, pooled=True) == "| all | 5 | 1 | 2 | 1 | 1 | +20.0 | - (rooms shared) |"


def test_an_episode_evaluated_twice_at_one_version_shows_as_extra() -> None:
    con = duckdb.connect()
    twice = [("r1", 0, "sokoban", "{}", 0, 0, True, 0.5)] * 2 + [("r1", 5, "sokoban", "{}", 0, 0, True, 0.5)]
    _evals(con, twice)
    got = con.execute(paired.PAIRS.format(which="run = 'r1'", temperature=0.5, env="", a=0, b=5)).fetchall()
    assert [r[-1] for r in got] == [1]  # main() refuses it rather than count the room twice


def _saved(tmp_path: Path, name: str, head: str, data: dict) -> None:
    (tmp_path / f"{name}.json").write_text(json.dumps({"printed": [head, "| run | ..."], "data": data}))


HEAD = "eval episodes paired v0 -> v20 (T=0.5)"


def test_also_joins_saved_runs_and_refuses_another_pairing_a_seed_twice_or_a_foreign_file(tmp_path: Path) -> None:
    here = {(1, "s1"): paired.Split(40, 17, 7, 64)}
    _saved(tmp_path, "s0", HEAD, {"s0": {"seed": 0, "both": 48, "gained": 25, "lost": 13, "neither": 42}})
    got = paired.joined(here, HEAD, "s0", tmp_path)
    assert vars(got[0, "s0"]) == {"both": 48, "gained": 25, "lost": 13, "neither": 42} and got[1, "s1"] == here[1, "s1"]
    with pytest.raises(
        SystemExit,
        match=r"--also s0: it measured 'eval episodes paired v0 -> v20 \(T=0.5\)', not 'eval episodes paired v0 -> v10",
    ):
        paired.joined(here, "eval episodes paired v0 -> v10 (T=0.5)", "s0", tmp_path)
    _saved(tmp_path, "again", HEAD, {"other-name": {"seed": 1, "both": 1, "gained": 0, "lost": 0, "neither": 0}})
    with pytest.raises(SystemExit, match=r"other-name \(seed 1\) already counted"):
        paired.joined(here, HEAD, "s0,again", tmp_path)
    (tmp_path / "seeds.json").write_text(json.dumps({"printed": [HEAD], "data": {"seeds": [0], "success": [[0.5]]}}))
    with pytest.raises(SystemExit, match=r"seeds\.json is not a table this script saved"):
        paired.joined(here, HEAD, "seeds", tmp_path)
    with pytest.raises(SystemExit, match="is not a table this script saved"):
        paired.joined(here, HEAD, "../nowhere", tmp_path)
