"""DuckDB views over the whole catalog.

Views (one row each of):
    runs      a run (catalog.runs.RUN_SCHEMA)
    steps     a stage of an iteration of a run, with the result key it used
    metrics   a metric of a step: run, iteration, node, stage, key, name, value
    results   a committed result: key, stage, version, node, run that made it, seconds, bytes
              stored, and in_memory: an artifact kept in its run's memory, stored as a digest
              and a recipe (`catalog.datasets.RESIDENT_FILE`: the policy between checkpoints)
    trials    a finished sweep trial (catalog.trials.TRIAL_SCHEMA)
    events    an early warning a run raised (catalog.runs.EVENT_SCHEMA)
    <view>    rows of every table output declared with ``Table(view=...)``
              (e.g. ``trajectories``), unioned by column name, per run
    turns     one row per turn of `trajectories` (catalog.schemas.DERIVED_VIEWS)
    placement where each step that ran did: the driver, its engine actors, its Ray Train workers

Only committed results are listed (their files are taken from manifests), so a
half-written result is never visible. Table views are scoped to runs: a run's rows
are those of the results its latest invocation's steps used (computed or taken
from the cache), with ``run`` set to that run, so a result two runs share appears
under both, and a result an earlier invocation of a run used, and its latest no
longer does, appears under neither (`pipeline gc` lists it). `connect(root)` gives a connection with the
views. For the plain duckdb client, every run refreshes ``<root>/views.sql``::

    import duckdb
    con = duckdb.connect()
    con.execute(open("pipeline-data/views.sql").read())
    con.sql("select * from metrics").show()
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from catalog.datasets import RESIDENT_FILE
from catalog.fs import Root
from catalog.runs import EVENT_SCHEMA, RUN_SCHEMA, STEP_SCHEMA, read_record, read_steps, run_names
from catalog.schemas import DERIVED_VIEWS, TABLE_VIEWS
from catalog.store import METRICS_FILE, METRICS_SCHEMA, Catalog
from catalog.trials import TRIAL_SCHEMA, trial_files
from common.errors import UserError

if TYPE_CHECKING:
    import duckdb

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
        ("bytes", pa.int64()),
        ("in_memory", pa.bool_()),
    ]
)
_DUCK_TYPES = {
    pa.bool_(): "BOOLEAN",
    pa.string(): "VARCHAR",
    pa.int8(): "TINYINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.timestamp("ms", tz="UTC"): "TIMESTAMPTZ",
}


def _quote(text: str) -> str:
    """A SQL string literal (no control characters reach the SQL text: a catalog's
    strings are escaped as JSON would)."""
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        text = json.dumps(text)[1:-1]
    return "'" + text.replace("'", "''") + "'"


def ident(name: str) -> str:
    """A quoted SQL identifier. Only names of the form `catalog.manifests.IDENTIFIER`
    reach SQL; the quotes make any other text an identifier too, never SQL."""
    return '"' + name.replace('"', '""') + '"'


def duck_type(t: pa.DataType) -> str:
    """The DuckDB type of an Arrow type, nested ones included."""
    if t in _DUCK_TYPES:
        return _DUCK_TYPES[t]
    if pa.types.is_list(t):
        return f"{duck_type(t.value_type)}[]"
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f"{ident(f.name)} {duck_type(f.type)}" for f in t) + ")"
    raise TypeError(f"no DuckDB type for {t}")


def _empty(schema: pa.Schema) -> str:
    cols = ", ".join(f"CAST(NULL AS {duck_type(f.type)}) AS {ident(f.name)}" for f in schema)
    return f"(SELECT {cols} WHERE false)"


class _Sources:
    """Builds the FROM expression of a set of Parquet files. On a query's connection
    it is a registered Arrow dataset that checks every page's CRC as it reads it (the
    catalog writes them): a damaged page fails the query, it never gives other rows
    (DuckDB's own reader does not check them). For ``views.sql`` (no connection, the
    plain duckdb client) it is `read_parquet`, unchecked."""

    def __init__(self, root: Root, con: duckdb.DuckDBPyConnection | None) -> None:
        self.root, self.con, self.count = root, con, 0

    def expr(self, paths: list[str], schema: pa.Schema | None) -> str | None:
        if not paths:
            return _empty(schema) if schema is not None else None
        if self.con is None:
            if not self.root.is_local:
                raise UserError(f"catalog {self.root.uri}: views.sql is only written for local roots")
            files = ", ".join(_quote(p) for p in paths)
            return f"read_parquet([{files}], union_by_name = true)"
        import pyarrow.dataset as pads
        import pyarrow.parquet as pq

        self.count += 1
        name = f"_source_{self.count}"
        in_fs = [p.split("://", 1)[1] if "://" in p else p for p in paths]  # the filesystem takes paths, not URIs
        # every file's columns, by name (files written before a column was added lack it: nulls)
        try:
            unified = pa.unify_schemas([pq.read_schema(p, filesystem=self.root.fs) for p in in_fs])
        except (OSError, pa.ArrowException):  # a name never registered: the view fails, `connect` names the file
            return f"_unreadable_{self.count}"
        checked = pads.ParquetFileFormat(
            default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True)
        )
        self.con.register(name, pads.dataset(in_fs, schema=unified, filesystem=self.root.fs, format=checked))
        return name

    def snapshot(self, paths: list[str], schema: pa.Schema, read: list[pa.Table] | None = None) -> str | None:
        """Like `expr`, for the small record files a live run replaces while it runs
        (run, steps, events): read once into memory (or taken as `read`, the same
        files already read) and registered, so that a query never sees a file replaced
        between two of DuckDB's reads of it (a `metrics` query during a run once failed
        with "Invalid data"). If one cannot be read, the files are left to `expr`, and
        the view fails when queried, naming it."""
        if self.con is None or not paths:
            return self.expr(paths, schema)

        try:
            parts = read if read is not None else [read_record(self.root, p.split("://", 1)[-1]) for p in paths]
            table = pa.concat_tables(parts, promote_options="default")
        except (OSError, pa.ArrowException):
            return self.expr(paths, schema)
        for f in schema:  # a column added since every one of these records was written
            if f.name not in table.column_names:
                table = table.append_column(f, pa.nulls(table.num_rows, f.type))
        self.count += 1
        name = f"_source_{self.count}"
        self.con.register(name, table)
        return name


def _results_rows(manifests: Iterable[dict]) -> list[dict[str, Any]]:
    return [
        {
            "key": m["key"],
            "stage": m.get("stage"),
            "version": m.get("version"),
            "node": m.get("node"),
            "run": m.get("run"),
            "iteration": m.get("iteration"),
            "seconds": m.get("seconds"),
            "config": json.dumps(m.get("config")),
            "inputs": json.dumps(m.get("inputs")),
            "bytes": sum(int(f.get("bytes", 0)) for f in _files(m).values()),
            "in_memory": any(rel.rsplit("/", 1)[-1] == RESIDENT_FILE for rel in _files(m)),
        }
        for m in manifests
    ]


def _files(manifest: dict) -> dict[str, Any]:
    files = manifest.get("files")
    return files if isinstance(files, dict) else {}


#: the views the catalog itself defines; a stage's table view may not take these names
#: one row per place a step that ran used: the driver, and each engine actor or Ray Train
#: worker (`role`, `index`; `ray_node`: the Ray node id, `host`: the machine's name, `rows`:
#: the episodes an engine actor played, in the order of the step's episode list)
PLACEMENT = (
    'SELECT s.run, s.iteration, s.node, s.stage, s.key, p.role, p."index", p.node AS ray_node, p.host, p.rows '
    'FROM steps s, LATERAL (SELECT unnest(from_json(s.placement, \'[{"role": "VARCHAR", "index": "BIGINT", '
    '"node": "VARCHAR", "host": "VARCHAR", "rows": "BIGINT"}]\')) AS p) l'
)

BUILT_IN = ("runs", "steps", "placement", "events", "trials", "metrics", "results", *DERIVED_VIEWS)


def view_statements(
    catalog: Catalog, con: duckdb.DuckDBPyConnection | None = None, notes: list[str] | None = None
) -> list[tuple[str, str, list[str]]]:
    """(view, CREATE VIEW statement, the files it reads) for the catalog's committed
    contents. No text from the catalog is pasted into SQL: names are checked
    (`catalog.manifests`) and quoted, values are escaped literals. Damaged results
    are left out, with a line each in `notes`."""
    root = catalog.root
    src = _Sources(root, con)
    manifests, bad = catalog.manifests()
    if notes is not None:
        notes += bad
    runs = run_names(root)
    run_files = [root.uri_of("runs", r, "run.parquet") for r in runs if root.exists("runs", r, "run.parquet")]
    # read once: the steps view and the results each run used come from the same records
    steps_of = {run: _read_steps(catalog, run, notes) for run in runs}
    step_runs = [r for r in runs if steps_of[r] is not None or root.exists("runs", r, "steps.parquet")]
    step_files = [root.uri_of("runs", r, "steps.parquet") for r in step_runs]
    event_files = [root.uri_of("runs", r, "events.parquet") for r in runs if root.exists("runs", r, "events.parquet")]
    metric_files = [root.uri_of("results", m["key"], METRICS_FILE) for m in manifests]
    out: list[tuple[str, str, list[str]]] = []

    def add(view: str, body: str, files: list[str]) -> None:
        out.append((view, f"CREATE OR REPLACE VIEW {ident(view)} AS {body}", files))

    add("runs", f"SELECT * FROM {src.snapshot(run_files, RUN_SCHEMA)}", run_files)
    read = [t for t in (steps_of[r] for r in step_runs) if t is not None]  # one per file, in step_files' order
    readable = len(read) == len(step_runs)  # else `expr` names the unreadable file
    steps_src = src.snapshot(step_files, STEP_SCHEMA, read if readable else None)
    # by name with the current schema: files written before a column (placement) was added still give it
    add("steps", f"SELECT * FROM {steps_src} UNION ALL BY NAME SELECT * FROM {_empty(STEP_SCHEMA)}", step_files)
    add("placement", PLACEMENT, [])
    add("events", f"SELECT * FROM {src.snapshot(event_files, EVENT_SCHEMA)}", event_files)
    trials = trial_files(root)
    add("trials", f"SELECT * FROM {src.expr(trials, TRIAL_SCHEMA)}", trials)
    add(
        "metrics",
        "SELECT s.run, s.iteration, s.node, s.stage, m.key, m.name, m.value "
        f"FROM steps s JOIN {src.expr(metric_files, METRICS_SCHEMA)} m ON s.key = m.key",
        metric_files,
    )
    add("results", f"SELECT * FROM {_inline(_results_rows(manifests))}", [])
    tables: dict[str, dict[str, list[str]]] = {}  # result key -> view -> files
    for m in manifests:
        for name, output in m["outputs"].items():
            view = output.get("view")
            if output["kind"] != "table" or not view:
                continue
            if view in BUILT_IN:
                if notes is not None:
                    notes.append(f"result {m['key']}: output '{name}' names the built-in view '{view}'; left out")
                continue
            files = [root.uri_of("results", m["key"], name, f) for f in output["files"]]
            tables.setdefault(m["key"], {}).setdefault(view, []).extend(files)
    views = sorted({v for by_view in tables.values() for v in by_view})
    per_run: dict[str, dict[str, list[str]]] = {v: {} for v in views}  # view -> run -> files
    for run in runs:
        steps = steps_of[run]
        for key in [] if steps is None else dict.fromkeys(steps["key"].to_pylist()):
            for view, files in tables.get(key, {}).items():
                per_run[view].setdefault(run, []).extend(files)
    for view in views:
        parts = [
            f"SELECT {_quote(run)} AS run, COLUMNS(lambda c: c <> 'run') FROM {src.expr(files, None)}"
            for run, files in sorted(per_run[view].items())
        ]
        if parts:
            add(view, " UNION ALL BY NAME ".join(parts), [f for files in per_run[view].values() for f in files])
    made = {v for v in views if per_run[v]}
    for view, schema in TABLE_VIEWS.items():  # a known view with no rows yet exists, empty
        if view not in made and view not in BUILT_IN:
            run_first = pa.schema([pa.field("run", pa.string()), *(f for f in schema if f.name != "run")])
            add(view, f"SELECT * FROM {_empty(run_first)}", [])
            made.add(view)
    for view, (base, select) in DERIVED_VIEWS.items():
        if base in made:
            add(view, select, [])
    return out


def _read_steps(catalog: Catalog, run: str, notes: list[str] | None) -> pa.Table | None:
    """Run `run`'s steps record (its latest invocation's), or None when it has none or
    it is unreadable (then with a note: the run's table rows are left out)."""
    try:
        return read_steps(catalog.root, run)
    except (OSError, pa.ArrowException) as exc:
        if notes is not None:
            notes.append(
                f"run {run}: steps.parquet is unreadable ({' '.join(str(exc).split())[:120]}); its rows are left out"
            )
        return None


def _inline(rows: list[dict[str, Any]]) -> str:
    """A VALUES list (the results index is small: one row a result; and no Arrow
    table is built from Python values, which would import pandas into every command)."""
    if not rows:
        return _empty(RESULTS_SCHEMA)

    def lit(v: object) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(int(v))
        if isinstance(v, float):
            return repr(float(v)) if math.isfinite(v) else "NULL"
        return _quote(v if isinstance(v, str) else json.dumps(v))

    values = ", ".join("(" + ", ".join(lit(v) for v in row.values()) + ")" for row in rows)
    types = ", ".join(f"CAST({ident(f.name)} AS {duck_type(f.type)}) AS {ident(f.name)}" for f in RESULTS_SCHEMA)
    return f"(SELECT {types} FROM (VALUES {values}) AS t({', '.join(ident(n) for n in RESULTS_SCHEMA.names)}))"


def connect(root: Catalog | Root | str | None = None, notes: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the catalog's views, sandboxed (`sandbox`)
    before anything from the catalog is read. A view that cannot be created (a
    damaged Parquet file) fails only when it is queried, naming the file; `notes`
    gets a line for it and for every damaged result left out."""
    import duckdb  # imported when a query runs: `validate` never pays for it

    catalog = root if isinstance(root, Catalog) else Catalog(root)
    con = duckdb.connect()
    sandbox(con, catalog)
    for view, stmt, files in view_statements(catalog, con, notes):
        try:
            con.execute(stmt)
        except duckdb.Error as exc:
            why = _unreadable(catalog, files) or " ".join(str(exc).split())[:200]
            line = f"view {view} is unavailable: {why}"
            if notes is not None:
                notes.append(line)
            # every read of it fails, a count(*) included (a row it need not compute would be counted)
            fail = f"error({_quote(line)})"
            con.execute(
                f"CREATE OR REPLACE VIEW {ident(view)} AS SELECT {fail} AS error FROM range(1) WHERE {fail} IS NULL"
            )
    return con


def _unreadable(catalog: Catalog, files: list[str]) -> str | None:
    """The first of `files` that is not a readable Parquet file, and why."""
    import pyarrow.parquet as pq

    for f in files:
        try:
            pq.read_metadata(f if catalog.root.is_local else f.split("://", 1)[-1], filesystem=catalog.root.fs)
        except (OSError, pa.ArrowException) as exc:
            return f"{f} is not a readable Parquet file ({' '.join(str(exc).split())[:120]})"
    return None


def write_views_sql(catalog: Catalog) -> None:
    """Refresh ``<root>/views.sql`` (local roots) for the plain duckdb client."""
    if catalog.root.is_local:
        text = ";\n".join(stmt for _, stmt, _ in view_statements(catalog)) + ";\n"
        catalog.root.put_atomic(text.encode(), "views.sql")


def sandbox(con: duckdb.DuckDBPyConnection, catalog: Catalog) -> None:
    """Let `con` read the catalog's folder and nothing else, for good: no other
    file, directory, URL or database, no extension installed or loaded, and the
    settings locked (a query cannot undo this). A remote catalog's tables are read
    through registered Arrow datasets, so there no folder is needed at all."""
    con.execute("SET temp_directory = ''")  # no spill folder: its default (./.tmp) would be readable too
    if catalog.root.is_local:
        con.execute(f"SET allowed_directories = [{_quote(catalog.root.base.rstrip('/') + '/')}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")
