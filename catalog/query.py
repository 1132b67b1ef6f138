"""Read-only SQL over the catalog's views (`catalog.views`): what `pipeline query`,
`runs` and `report` run, with a row limit, a timeout, and interrupts that stop the
query rather than wait for it."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from catalog.runs import read_steps
from catalog.store import Catalog
from catalog.views import connect
from common.errors import UserError, did_you_mean


@dataclass(frozen=True)
class Answer:
    """A query's rows (at most `limit` of them), how many rows the query gave in all,
    and notes on what the catalog left out (damaged results, unreadable files)."""

    table: pa.Table
    total: int
    notes: tuple[str, ...] = ()

    @property
    def hidden(self) -> int:
        return self.total - self.table.num_rows


#: seconds a query may take by default (`pipeline query --timeout`)
DEFAULT_TIMEOUT = 300.0


def query(catalog: Catalog, sql: str) -> pa.Table:
    """Every row of read-only SQL over the catalog's views (see `ask`)."""
    return ask(catalog, sql).table


def metrics_by_iteration(catalog: Catalog, run: str) -> dict[int, dict[str, float]]:
    """A run's per-iteration metrics (the `metrics` view), by iteration: what its early
    warnings read (`pipelines.run.watch.replay`)."""
    q = run.replace("'", "''")
    rows = query(
        catalog,
        f"select iteration, name, value from metrics where run = '{q}' and iteration is not null order by iteration",
    ).to_pylist()
    by: dict[int, dict[str, float]] = {}
    for r in rows:
        by.setdefault(r["iteration"], {})[r["name"]] = r["value"]
    return by


def _first_damaged(catalog: Catalog) -> str | None:
    """The first result whose files are not what was committed (every byte read), as
    ``result <key>: <what>``; None when all are. Only after a query failed: its error
    then names the file instead of the reader's words for a damaged page."""
    manifests, _ = catalog.manifests()
    for m in manifests:
        problems = catalog.check(m["key"], full=True, manifest=m)
        if problems:
            return f"result {m['key']}: {problems[0]}"
    return None


def _unknown_view(con: duckdb.DuckDBPyConnection, message: str) -> str:
    """DuckDB's "Table with name x does not exist!" with its hint replaced by the
    catalog's views (its own may name an internal table, e.g. "pg_namespace")."""
    found = re.match(r"(Catalog Error: Table with name (.+?) does not exist!)", message)
    if not found:
        return message
    try:
        views = [
            r[0]
            for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()
            if not r[0].startswith("_")  # the registered sources the views read
        ]
    except duckdb.Error:  # the connection is gone: DuckDB's own words
        return message
    return f"{found.group(1)}{did_you_mean(found.group(2), views)}"


def ask(catalog: Catalog, sql: str, limit: int | None = None, timeout: float | None = DEFAULT_TIMEOUT) -> Answer:
    """Run read-only SQL over the catalog's views and nothing else: SELECT (several
    statements allowed; the last one's rows are returned) and EXPLAIN [ANALYZE] of a
    SELECT, on a connection that can read only the catalog's folder (`sandbox`).
    At most `limit` rows are kept (the rest are counted, not held); after `timeout`
    seconds the query is stopped (`UserError`). A KeyboardInterrupt (SIGINT, or a
    signal handler's `Interrupted`) stops the query and is raised again."""
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"query: the SQL is not UTF-8 text (character {exc.start})") from None
    notes: list[str] = []
    con = connect(catalog, notes)
    statements = _statements(con, sql)
    box: dict[str, Any] = {}

    def work() -> None:
        reader = None
        try:
            for s in statements[:-1]:
                con.execute(s.query).fetchall()  # run to the end: the next statement needs the connection
            reader = con.sql(statements[-1].query).to_arrow_reader(8192)
            kept, total = [], 0
            for batch in reader:
                if limit is None or total < limit:
                    kept.append(batch if limit is None else batch.slice(0, limit - total))
                total += batch.num_rows
            box["answer"] = (pa.Table.from_batches(kept, schema=reader.schema), total)
        except BaseException as exc:  # handed to the caller's thread, without the frames that hold the reader
            box["error"] = exc.with_traceback(None)
            if isinstance(exc, duckdb.CatalogException):  # the views, for a hint, while the connection is open
                box["error"] = duckdb.CatalogException(_unknown_view(con, " ".join(str(exc).split())))
        finally:
            if reader is not None:
                reader.close()
            del reader
            done.set()

    # the query runs in a thread and this one waits on an Event, which a signal can
    # interrupt (a KeyboardInterrupt inside Thread.join can leave the thread looking dead)
    done = threading.Event()
    worker = threading.Thread(target=work, name="query", daemon=True)
    started = time.monotonic()
    worker.start()
    try:
        while not done.wait(0.05):
            if timeout is not None and time.monotonic() - started > timeout:
                con.interrupt()
                _wait(done, con, grace=float("inf"))
                raise UserError(f"query: stopped after {timeout:g} s (--timeout)")
    except KeyboardInterrupt as exc:
        con.interrupt()
        if not _wait(done, con):
            raise Abandoned(getattr(exc, "signum", signal.SIGINT)) from None
        raise
    finally:
        if done.is_set():
            with contextlib.suppress(duckdb.Error):
                con.close()
    error = box.get("error")
    if isinstance(error, duckdb.Error):
        raise _user_error(error, catalog, notes) from None
    if error is not None:
        raise error
    table, total = box["answer"]
    return Answer(table, total, tuple(notes))


def _statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    """The statements of `sql`, each checked to be one that only reads (`UserError` if not,
    or if there is none)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise UserError(f"query: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise UserError("query: no SQL statement given")
    for s in statements:
        _check_read_only(con, s)
    return statements


def _user_error(error: duckdb.Error, catalog: Catalog, notes: list[str]) -> UserError:
    """What DuckDB's `error` means to the user, in one line: a read outside the catalog
    refused, a view that could not be made (`notes`), a damaged stored file, or DuckDB's
    own words."""
    if isinstance(error, duckdb.PermissionException):
        where = catalog.root.uri if catalog.root.is_local else "its registered tables"
        found = re.search(r'"([^"]*)"', str(error))
        return UserError(
            f"query: a query reads the catalog's views and files ({where}) and nothing else; refused: "
            f"{found.group(1) if found else ' '.join(str(error).split())[:200]}"
        )
    said = " ".join(str(error).split())[:300]
    unavailable = [n for n in notes if n.startswith("view ") and " is unavailable: " in n]
    if unavailable and isinstance(error, (duckdb.BinderException, duckdb.InvalidInputException)):
        return UserError(f"query: {'; '.join(unavailable)}")  # not a column named `error`
    if not isinstance(error, (duckdb.BinderException, duckdb.CatalogException, duckdb.ParserException)):
        damaged = _first_damaged(catalog)
        if damaged is not None:
            return UserError(
                f"query: {damaged}; pipeline verify moves it aside and a run computes it again (DuckDB: {said})"
            )
    return UserError(f"query: {said}")


#: seconds an interrupted query is given to stop before its caller goes on without it
STOP_GRACE = 2.0


def _wait(done: threading.Event, con: duckdb.DuckDBPyConnection, grace: float = STOP_GRACE) -> bool:
    """Wait up to `grace` seconds for an interrupted query's thread to finish,
    interrupting again every 0.2 s (an interrupt that lands before DuckDB starts
    executing is lost); a second signal meanwhile is absorbed: the query is being
    stopped already. Whether it finished: DuckDB checks for interrupts between tasks,
    and on a loaded machine one task can run for many seconds."""
    end = time.monotonic() + grace
    while True:
        try:
            if done.wait(0.2):
                return True
            if time.monotonic() > end:
                return False
            con.interrupt()
        except KeyboardInterrupt:
            continue


class Abandoned(KeyboardInterrupt):
    """An interrupted query whose thread was still inside DuckDB after the grace
    period: the caller should exit the process without waiting for it (`os._exit`)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__("query interrupted")


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
    import duckdb  # imported when a query runs: `validate` never pays for it

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
