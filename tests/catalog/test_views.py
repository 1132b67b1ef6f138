"""DuckDB views over a real catalog, from `query`, `connect` and plain duckdb."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from catalog.query import query
from catalog.store import Catalog
from catalog.views import connect
from common.errors import UserError
from tests.conftest import TEST_PIPELINE, run_spec


@pytest.fixture
def filled(spec_file, catalog):
    run_spec(spec_file(TEST_PIPELINE), catalog)
    return catalog


def test_runs_steps_metrics_results(filled):
    assert query(filled, "select run, status, iterations from runs").to_pylist() == [
        {"run": "spec", "status": "finished", "iterations": 3}
    ]
    steps = query(filled, "select node, count(*) n from steps group by node order by node").to_pylist()
    assert steps == [
        {"node": "init", "n": 1},
        {"node": "scale", "n": 3},
        {"node": "source", "n": 3},
        {"node": "state", "n": 3},
    ]
    total = query(filled, "select value from metrics where name='adv/total' and iteration=1").column(0).to_pylist()
    assert total == [3.0 * sum(100 + i for i in range(4))]
    assert query(filled, "select count(*) from results").column(0).to_pylist() == [10]


def test_stage_declared_views(filled):
    rows = query(filled, "select iteration, count(*) n from t_numbers group by 1 order by 1").to_pylist()
    assert rows == [{"iteration": i, "n": 4} for i in range(3)]


def test_plain_duckdb_client_reads_views_sql(filled):
    con = duckdb.connect()
    con.execute(Path(filled.root.path("views.sql")).read_text())
    assert (
        con.sql("select count(*) from metrics").fetchall()[0][0] == 1 + 3 * 3 * 2
    )  # init: perf; 3 stages x 3 iterations x (own metric + perf)
    assert con.sql("select sum(value) from t_scaled").fetchall()[0][0] == pytest.approx(
        3.0 * sum(it * 100 + i for it in range(3) for i in range(4))
    )


def test_empty_catalog_has_typed_empty_views(catalog):
    con = connect(catalog)
    assert con.sql("select count(*) from runs").fetchall()[0][0] == 0
    assert con.sql("select count(*) from metrics").fetchall()[0][0] == 0


@pytest.mark.parametrize(
    "sql,pattern",
    [
        ("copy (select 1) to 'x.csv'", r"only SELECT statements are allowed, got COPY"),
        ("create table t as select 1", r"only SELECT statements are allowed, got CREATE"),
        ("select * from nowhere", r"query: Catalog Error: Table with name nowhere does not exist"),
        ("selec 1", r"query: Parser Error"),
        ("", r"no SQL statement given"),
    ],
)
def test_bad_queries_are_user_errors(filled, sql, pattern):
    with pytest.raises(UserError, match=pattern):
        query(filled, sql)


#: queries that must not read or write outside the catalog, nor change the connection
HOSTILE = [
    "select * from read_text('/etc/passwd')",
    "select * from read_csv('/etc/passwd')",
    "select * from read_blob('/etc/hostname')",
    "select * from glob('/etc/*')",
    "select * from read_parquet('{outside}/*.parquet')",
    "select * from read_parquet('{root}/../outside/*.parquet')",
    "select * from read_json('{outside}/secret.json')",
    "select * from read_parquet('https://example.com/x.parquet')",
    "EXPLAIN ANALYZE COPY (SELECT 42) TO '{root}/x.csv'",
    "EXPLAIN ANALYZE COPY (SELECT 42) TO '{outside}/x.csv'",
    "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
    "EXPLAIN (FORMAT json) COPY (SELECT 1) TO '{root}/y.csv'",
    "COPY (SELECT 42) TO '{root}/x.csv'",
    "select 1; COPY (SELECT 42) TO '{outside}/x.csv'",
    "ATTACH '{outside}/db.duckdb'",
    "SET enable_external_access = true",
    "RESET allowed_directories",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA version",
    "CALL pragma_version()",
    "CREATE TABLE t AS SELECT 1",
    "drop view runs",
]


@pytest.mark.parametrize("sql", HOSTILE)
def test_a_query_reads_the_catalog_and_nothing_else(filled, tmp_path, sql):
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"secret": [1]}), outside / "s.parquet")
    (outside / "secret.json").write_text('{"secret": 1}')
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(UserError) as err:
        query(filled, sql.format(root=filled.root.base, outside=outside))
    assert "\n" not in str(err.value)
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written anywhere


def test_the_catalog_itself_stays_readable_and_several_selects_give_the_last(filled):
    files = f"{filled.root.base}/results/*/numbers/*.parquet"
    assert query(filled, f"select count(*) from read_parquet('{files}')").column(0).to_pylist()[0] > 0
    assert query(filled, "select 1 as a; select 2 as b").to_pylist() == [{"b": 2}]
    assert query(filled, "EXPLAIN ANALYZE select count(*) from runs").num_rows >= 1
    assert query(filled, "select current_setting('enable_external_access') as on").to_pylist() == [{"on": False}]


def _record(catalog, run: str, keys: list[str]) -> None:
    """A finished run record whose steps used `keys` (as `pipeline run` writes it)."""
    from catalog.runs import RunLog, RunRecord, StepRecord

    log = RunLog(catalog.root, RunRecord(run=run, spec_file="x.yaml", spec="", iterations=1, seed=0))
    for i, key in enumerate(keys):
        log.add_step(StepRecord(run, i, "node", "stage", key, "ran", 0.0, 0.0))
    log.finish("finished")


def _rows_table(catalog, key: str, values: list[int], run: str = "maker") -> None:
    import pyarrow as pa

    from catalog.datasets import Table

    table = pa.table({"run": [run] * len(values), "x": values})
    catalog.writer(key, {"rows": Table(view="numbers")}).commit({"rows": table}, {}, {})


def test_a_result_two_runs_share_appears_under_both(catalog):
    _rows_table(catalog, "shared-1", [1, 2])
    _rows_table(catalog, "own-1", [3])
    _record(catalog, "a", ["shared-1"])
    _record(catalog, "b", ["shared-1", "own-1"])
    got = query(catalog, "select run, sum(x) s, count(*) n from numbers group by 1 order by 1").to_pylist()
    assert got == [{"run": "a", "s": 3, "n": 2}, {"run": "b", "s": 6, "n": 3}]


def test_a_rerun_under_the_same_name_does_not_mix_in_the_old_rows(catalog):
    _rows_table(catalog, "old-1", [1, 2])
    _record(catalog, "a", ["old-1"])
    _rows_table(catalog, "new-1", [10])
    _record(catalog, "a", ["new-1"])  # the spec changed: the latest invocation used another result
    assert query(catalog, "select run, x from numbers").to_pylist() == [{"run": "a", "x": 10}]
    # the old result is still in the catalog (gc lists it), under no run
    assert query(catalog, "select count(*) from results").column(0).to_pylist() == [2]


def test_a_result_no_run_used_is_in_no_view(catalog):
    _rows_table(catalog, "loose-1", [1])
    _rows_table(catalog, "used-1", [2])
    _record(catalog, "a", ["used-1"])
    assert query(catalog, "select x from numbers").column(0).to_pylist() == [2]


def test_eval_behaviour_reads_where_each_move_led(catalog):
    """The derived views over eval turns: moves into a hole and goal-line copies, per version."""
    import pyarrow as pa

    from catalog.datasets import Table
    from catalog.schemas import TURN

    def turn(state: str, action: str) -> dict:
        return {"turn": 1, "state": state, "actions": [action], "valid": [True], "format_ok": True}

    local = "Goal: 2 Left.\nLeft: hole. Down: ice. Right: edge. Up: ice."
    relative = "Goal: rows +0, columns -2.\nLeft: ice. Down: hole. Right: edge. Up: ice."
    room = "Box: rows +0, columns +1.\nTarget: rows +0, columns +2.\nUp: wall. Down: a box that cannot move. Left: floor. Right: a box, pushed onto a target."
    corner = "Box: rows +0, columns -1.\nUp: wall. Down: floor. Left: a box, pushed into a corner. Right: floor."
    rows = [
        {
            "run": "r",
            "policy_version": 0,
            "env": "frozenlake",
            "env_options": "{}",
            "seed": 1,
            "sample": 0,
            "turns": [turn(local, "Left"), turn(local, "Up")],
        },
        {
            "run": "r",
            "policy_version": 1,
            "env": "frozenlake",
            "env_options": "{}",
            "seed": 1,
            "sample": 0,
            # the grid, read cell by cell: Down from P is a hole; Up is the edge, away from G
            "turns": [turn(relative, "Left"), turn("__P_\nG_O_", "Down"), turn("P___\n_G__", "Up")],
        },
        {
            "run": "r",
            "policy_version": 0,
            "env": "sokoban",
            "env_options": "{}",
            "seed": 2,
            "sample": 0,
            "turns": [turn(room, "Right"), turn(room, "Up"), turn(room, "Down"), turn(corner, "Left")],
        },
    ]
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("policy_version", pa.int64()),
            ("env", pa.string()),
            ("env_options", pa.string()),
            ("seed", pa.int64()),
            ("sample", pa.int64()),
            ("temperature", pa.float64()),
            ("turns", pa.list_(TURN)),
        ]
    )
    catalog.writer("eval-1", {"evals": Table(view="evals")}).commit(
        {"evals": pa.Table.from_pylist([{**r, "temperature": 0.5} for r in rows], schema)}, {}, {}
    )
    _record(catalog, "r", ["eval-1"])
    got = query(
        catalog,
        "select env, policy_version, turns, into_hole, into_edge, copies_goal_word, toward_goal from eval_behaviour "
        "where env = 'frozenlake'",
    ).to_pylist()
    assert got == [
        {
            "env": "frozenlake",
            "policy_version": 0,
            "turns": 2,
            "into_hole": 0.5,
            "into_edge": 0.0,
            "copies_goal_word": 0.5,
            "toward_goal": None,  # the local view writes no signed offset
        },
        # the grid turns have no goal line to copy from: NULL, left out of that share
        {
            "env": "frozenlake",
            "policy_version": 1,
            "turns": 3,
            "into_hole": 1 / 3,
            "into_edge": 1 / 3,
            "copies_goal_word": 0.0,
            "toward_goal": 2 / 3,
        },
    ]
    grid = query(catalog, "select leads_to, toward_goal from eval_turns where state like '%P%' order by action")
    assert grid.to_pylist() == [{"leads_to": "hole", "toward_goal": True}, {"leads_to": "edge", "toward_goal": False}]
    room_row = query(
        catalog, "select turns, into_wall, onto_target, into_corner from eval_behaviour where env = 'sokoban'"
    )
    assert room_row.to_pylist() == [{"turns": 4, "into_wall": 2 / 4, "onto_target": 1 / 4, "into_corner": 1 / 4}]
    led = query(catalog, "select leads_to from eval_turns where env = 'sokoban' order by turn, action")
    assert sorted(r["leads_to"] for r in led.to_pylist()) == [
        "a box that cannot move",
        "a box, pushed into a corner",
        "a box, pushed onto a target",
        "wall",
    ]


def test_a_connection_reads_the_run_records_once_so_a_live_run_cannot_change_them_under_a_query(catalog):
    """A live run replaces steps.parquet after every step; a connection made before
    sees the records as they were when it was made, never a file swapped between two
    of DuckDB's reads of it."""
    _record(catalog, "live", ["k-1"])
    con = connect(catalog)
    _record(catalog, "live", ["k-1", "k-2", "k-3"])  # the run goes on: every record file replaced
    assert con.execute("select count(*) from steps").fetchall() == [(1,)]
    assert con.execute("select run from runs").fetchall() == [("live",)]
    assert connect(catalog).execute("select count(*) from steps").fetchall() == [(3,)]


def test_steps_recorded_before_placement_existed_still_give_the_placement_view(tmp_path):
    """A catalog written before steps recorded their placement: the `steps` view has the
    column (null) and `placement` is empty, from `pipeline query` and from views.sql."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from catalog.runs import RUN_SCHEMA, STEP_SCHEMA
    from catalog.views import write_views_sql

    catalog = Catalog(str(tmp_path))
    folder = tmp_path / "runs" / "old"
    folder.mkdir(parents=True)
    old = pa.schema([f for f in STEP_SCHEMA if f.name != "placement"])
    step = {"run": "old", "iteration": 0, "node": "rollout", "stage": "rollout", "key": "k", "status": "ran"}
    pq.write_table(pa.Table.from_pylist([step], schema=old), folder / "steps.parquet")
    run = {"run": "old", "status": "finished", "iterations": 1, "seed": 0}
    pq.write_table(pa.Table.from_pylist([run], schema=RUN_SCHEMA), folder / "run.parquet")
    assert query(catalog, "select node, placement from steps").to_pylist() == [{"node": "rollout", "placement": None}]
    assert query(catalog, "select * from placement").num_rows == 0
    write_views_sql(catalog)
    con = duckdb.connect()
    con.execute((tmp_path / "views.sql").read_text())
    assert con.execute("select count(*) from placement").fetchall() == [(0,)]
