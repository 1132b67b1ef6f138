"""DuckDB views over the whole catalog.

Views (one row each of):
    runs      a run (catalog.runs.RUN_SCHEMA)
    steps     a stage of an iteration of a run, with the result key it used
    metrics   a metric of a step: run, iteration, node, stage, key, name, value
    results   a committed result: key, stage, version, node, run that made it, seconds
    trials    a finished sweep trial (catalog.trials.TRIAL_SCHEMA)
    events    an early warning a run raised (catalog.runs.EVENT_SCHEMA)
    <view>    rows of every table output declared with ``Table(view=...)``
              (e.g. ``trajectories``), unioned by column name
    turns     one row per turn of `trajectories` (catalog.schemas.DERIVED_VIEWS)

Only committed results are listed (their files are taken from manifests), so a
half-written result is never visible. `connect(root)` gives a connection with the
views. For the plain duckdb client, every run refreshes ``<root>/views.sql``::

    import duckdb
    con = duckdb.connect()
    con.execute(open("pipeline-data/views.sql").read())
    con.sql("select * from metrics").show()
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import duckdb
import pyarrow as pa

from catalog.fs import Root
from catalog.runs import EVENT_SCHEMA, RUN_SCHEMA, STEP_SCHEMA, read_steps
from catalog.schemas import DERIVED_VIEWS
from catalog.store import METRICS_FILE, METRICS_SCHEMA, Catalog
from catalog.trials import TRIAL_SCHEMA, trial_files
from common.errors import UserError

RESULTS_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("stage", pa.string()),
        ("version", pa.int64()),
        ("node", pa.string()),
        ("run", pa.string()),
        ("iteration", pa.int64()),
        ("seconds", pa.float64()),
        ("config", pa.string()),
        ("inputs", pa.string()),
    ]
)
_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.timestamp("ms", tz="UTC"): "TIMESTAMPTZ",
}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _empty(schema: pa.Schema) -> str:
    cols = ", ".join(f"CAST(NULL AS {_DUCK_TYPES[f.type]}) AS {f.name}" for f in schema)
    return f"(SELECT {cols} WHERE false)"


class _Sources:
    """Builds the FROM expression of a set of Parquet files: `read_parquet` on a
    local root; a registered Arrow dataset on a remote one (DuckDB then needs no
    filesystem extension)."""

    def __init__(self, root: Root, con: duckdb.DuckDBPyConnection | None) -> None:
        self.root, self.con, self.count = root, con, 0

    def expr(self, paths: list[str], schema: pa.Schema | None) -> str | None:
        if not paths:
            return _empty(schema) if schema is not None else None
        if self.root.is_local:
            files = ", ".join(_quote(p) for p in paths)
            return f"read_parquet([{files}], union_by_name = true)"
        if self.con is None:
            raise UserError(f"catalog {self.root.uri}: views.sql is only written for local roots")
        import pyarrow.dataset as pads

        self.count += 1
        name = f"_source_{self.count}"
        in_fs = [p.split("://", 1)[1] if "://" in p else p for p in paths]  # the filesystem takes paths, not URIs
        self.con.register(name, pads.dataset(in_fs, filesystem=self.root.fs, format="parquet"))
        return name


def _results_rows(manifests: Iterable[dict]) -> list[dict[str, Any]]:
    return [
        {
            "key": m["key"],
            "stage": m["stage"],
            "version": m["version"],
            "node": m.get("node"),
            "run": m.get("run"),
            "iteration": m.get("iteration"),
            "seconds": m.get("seconds"),
            "config": json.dumps(m.get("config")),
            "inputs": json.dumps(m.get("inputs")),
        }
        for m in manifests
    ]


def view_statements(catalog: Catalog, con: duckdb.DuckDBPyConnection | None = None) -> list[str]:
    """The CREATE VIEW statements for the catalog's current committed contents."""
    root = catalog.root
    src = _Sources(root, con)
    manifests = [catalog.manifest(k) for k in catalog.result_keys()]
    runs = root.list_dirs("runs")
    run_files = [root.uri_of("runs", r, "run.parquet") for r in runs if root.exists("runs", r, "run.parquet")]
    step_files = [root.uri_of("runs", r, "steps.parquet") for r in runs if root.exists("runs", r, "steps.parquet")]
    event_files = [root.uri_of("runs", r, "events.parquet") for r in runs if root.exists("runs", r, "events.parquet")]
    metric_files = [root.uri_of("results", m["key"], METRICS_FILE) for m in manifests]
    stmts = [
        f"CREATE OR REPLACE VIEW runs AS SELECT * FROM {src.expr(run_files, RUN_SCHEMA)}",
        f"CREATE OR REPLACE VIEW steps AS SELECT * FROM {src.expr(step_files, STEP_SCHEMA)}",
        f"CREATE OR REPLACE VIEW events AS SELECT * FROM {src.expr(event_files, EVENT_SCHEMA)}",
        f"CREATE OR REPLACE VIEW trials AS SELECT * FROM {src.expr(trial_files(root), TRIAL_SCHEMA)}",
        "CREATE OR REPLACE VIEW metrics AS SELECT s.run, s.iteration, s.node, s.stage, m.key, m.name, m.value "
        f"FROM steps s JOIN {src.expr(metric_files, METRICS_SCHEMA)} m ON s.key = m.key",
    ]
    stmts.append(f"CREATE OR REPLACE VIEW results AS SELECT * FROM {_inline(_results_rows(manifests))}")
    by_view: dict[str, list[str]] = {}
    for m in manifests:
        for name, out in m["outputs"].items():
            if out["kind"] == "table" and out.get("view"):
                by_view.setdefault(out["view"], []).extend(
                    root.uri_of("results", m["key"], name, f) for f in out["files"]
                )
    for view, files in sorted(by_view.items()):
        stmts.append(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {src.expr(files, None)}")
    for view, (base, select) in DERIVED_VIEWS.items():
        if base in by_view:
            stmts.append(f"CREATE OR REPLACE VIEW {view} AS {select}")
    return stmts


def _inline(rows: list[dict[str, Any]]) -> str:
    """A VALUES list (the results index is small: one row a result; and no Arrow
    table is built from Python values, which would import pandas into every command)."""
    if not rows:
        return _empty(RESULTS_SCHEMA)

    def lit(v: object) -> str:
        return "NULL" if v is None else _quote(v) if isinstance(v, str) else repr(v)

    values = ", ".join("(" + ", ".join(lit(v) for v in row.values()) + ")" for row in rows)
    types = ", ".join(f"CAST({f.name} AS {_DUCK_TYPES[f.type]}) AS {f.name}" for f in RESULTS_SCHEMA)
    return f"(SELECT {types} FROM (VALUES {values}) AS t({', '.join(RESULTS_SCHEMA.names)}))"


def connect(root: Catalog | Root | str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the catalog's views."""
    catalog = root if isinstance(root, Catalog) else Catalog(root)
    con = duckdb.connect()
    for stmt in view_statements(catalog, con):
        con.execute(stmt)
    return con


def write_views_sql(catalog: Catalog) -> None:
    """Refresh ``<root>/views.sql`` (local roots) for the plain duckdb client."""
    if catalog.root.is_local:
        text = ";\n".join(view_statements(catalog)) + ";\n"
        catalog.root.put_atomic(text.encode(), "views.sql")


def query(catalog: Catalog, sql: str) -> pa.Table:
    """Run read-only SQL over the catalog's views and nothing else: SELECT (several
    statements allowed; the last one's rows are returned) and EXPLAIN [ANALYZE] of a
    SELECT, on a connection that can read only the catalog's folder (`sandbox`)."""
    con = connect(catalog)
    sandbox(con, catalog)
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise UserError(f"query: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise UserError("query: no SQL statement given")
    for s in statements:
        _check_read_only(con, s)
    try:
        for s in statements[:-1]:
            con.execute(s.query).fetchall()  # run to the end: the next statement needs the connection
        return con.sql(statements[-1].query).to_arrow_table()
    except duckdb.PermissionException as exc:
        where = catalog.root.uri if catalog.root.is_local else "its registered tables"
        found = re.search(r'"([^"]*)"', str(exc))
        raise UserError(
            f"query: a query reads the catalog's views and files ({where}) and nothing else; refused: "
            f"{found.group(1) if found else ' '.join(str(exc).split())[:200]}"
        ) from None
    except duckdb.Error as exc:
        raise UserError(f"query: {' '.join(str(exc).split())[:300]}") from None


_EXPLAIN = re.compile(r"^\s*explain\s+(analy[sz]e\s+)?(\([^()]*\)\s*)?", re.IGNORECASE)


def _check_read_only(con: duckdb.DuckDBPyConnection, statement: Any) -> None:
    """A SELECT, or an EXPLAIN of one (EXPLAIN ANALYZE runs its statement)."""
    text = statement.query.strip()
    kind = statement.type
    if kind == duckdb.StatementType.EXPLAIN:
        inner = con.extract_statements(_EXPLAIN.sub("", text, count=1))
        if len(inner) != 1 or inner[0].type != duckdb.StatementType.SELECT:
            raise UserError(f"query: EXPLAIN is allowed only of a SELECT statement, got: {text[:60]}")
        return
    if kind != duckdb.StatementType.SELECT:
        raise UserError(f"query: only SELECT statements are allowed, got {kind.name}: {text[:60]}")


def sandbox(con: duckdb.DuckDBPyConnection, catalog: Catalog) -> None:
    """Let `con` read the catalog's folder and nothing else, for good: no other
    file, directory, URL or database, no extension installed or loaded, and the
    settings locked (a query cannot undo this). A remote catalog's tables are read
    through registered Arrow datasets, so there no folder is needed at all."""
    if catalog.root.is_local:
        con.execute(f"SET allowed_directories = [{_quote(catalog.root.base.rstrip('/') + '/')}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def run_outputs(catalog: Catalog, run: str, view: str) -> list[str]:
    """Addresses of the table outputs joining `view` that run `run` used (made or
    found cached), in the order of its steps; [] for an unknown run."""
    steps = read_steps(catalog.root, run)
    found: list[str] = []
    for key in [] if steps is None else steps["key"].to_pylist():
        for name, out in catalog.manifest(key)["outputs"].items():
            address = f"{key}/{name}"
            if out["kind"] == "table" and out.get("view") == view and address not in found:
                found.append(address)
    return found


def select_where(table: pa.Table, name: str, where: str | None, order_by: str | None = None) -> pa.Table:
    """Rows of an in-memory `table`, seen as the view `name`, that satisfy the SQL
    condition `where` (all rows for None), optionally ordered. A condition that is
    not one boolean expression over the table's columns is a `UserError`."""
    con = duckdb.connect()
    con.register(name, table)
    sql = (
        f'SELECT * FROM "{name}"'
        + (f" WHERE ({where})" if where else "")
        + (f" ORDER BY {order_by}" if order_by else "")
    )
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise UserError(f"'{where}' is not a single SQL condition")
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        raise UserError(f"'{where}': {' '.join(str(exc).split())[:200]}") from None
    finally:
        con.close()
