"""The `pipeline` command.

A user mistake (bad spec, override, name or query) prints one line,
``error: <file>: <key>: <what was expected>``, and exits 2. A stage that fails
prints one line and exits 1; its traceback is written to
``<catalog>/runs/<run>/error.txt`` (or shown with ``--debug``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from common.errors import Interrupted, StageFailed
from pipelines.cli_common import (
    AddressOpt,
    CatalogOpt,
    FromOpt,
    Imports,
    OnlyOpt,
    Overrides,
    ToOpt,
    app,
    printable,
    usage_error,
    user_errors,
)
from pipelines.cli_common import fail as _fail
from pipelines.cli_common import note as _note


class ShowFormat(StrEnum):
    text = "text"
    mermaid = "mermaid"


class QueryFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _load(spec: str, overrides: list[str] | None, imports: list[str] | None = None) -> Any:
    import stages  # noqa: F401  (registers the stages)
    from pipelines.load import load_spec

    return load_spec(spec, overrides or [], tuple(imports or ()))


@app.command()
@user_errors
def validate(spec: str, override: Overrides = None, imports: Imports = None) -> None:
    """Check a spec without running anything: keys, types, ranges, names, wiring."""
    loaded = _load(spec, override, imports)
    typer.echo(f"ok: {loaded.file}: {len(loaded.nodes)} stages, {loaded.run.iterations} iterations")


@app.command()
@user_errors
def explain(
    spec: str, key: Annotated[str | None, typer.Argument()] = None, override: Overrides = None, imports: Imports = None
) -> None:
    """Print every setting (or those under KEY, e.g. `rollout` or `update.optim.lr`)
    with its value, doc, bounds, the paper's value and the file or override that set it."""
    from pipelines.explain import explain as text

    typer.echo(text(_load(spec, override, imports), key))


@app.command()
@user_errors
def show(
    spec: str,
    override: Overrides = None,
    format: Annotated[ShowFormat, typer.Option("--format")] = ShowFormat.text,
    catalog: CatalogOpt = None,
    to: ToOpt = None,
    only: OnlyOpt = None,
    start: FromOpt = None,
    imports: Imports = None,
) -> None:
    """Print a spec's DAG (text, or a Mermaid flowchart). With --catalog, --to, --only
    or --from, each stage is marked with what `pipeline run` would do: run, take
    from the catalog, or leave out."""
    from pipelines.dag import build_graph
    from pipelines.show import render_mermaid, render_text, would_run

    loaded = _load(spec, override, imports)
    graph = build_graph(loaded)
    if format == ShowFormat.mermaid:
        typer.echo(render_mermaid(graph))
        return
    status = None
    if catalog is not None or to or only or start:
        from pipelines.select import Selection

        status = would_run(loaded, graph, catalog, Selection.of(to or (), only or (), start or ()))
    typer.echo(render_text(graph, loaded.run.iterations, status))


@app.command()
@user_errors
def run(
    spec: str,
    override: Overrides = None,
    catalog: CatalogOpt = None,
    address: AddressOpt = None,
    debug: Annotated[bool, typer.Option("--debug", help="show a failing stage's traceback")] = False,
    to: ToOpt = None,
    only: OnlyOpt = None,
    start: FromOpt = None,
    imports: Imports = None,
) -> None:
    """Run a pipeline; steps already in the catalog are skipped (re-run to resume).
    --to, --only and --from run part of it (docs/guide.md, "Running part of a pipeline")."""
    from catalog.store import Catalog
    from pipelines.progress import RichDisplay
    from pipelines.runner import Runner
    from pipelines.select import Selection

    loaded = _load(spec, override, imports)
    store = Catalog(catalog or loaded.catalog.root)
    selection = Selection.of(to or (), only or (), start or ())
    try:
        summary = Runner(loaded, store, RichDisplay(), ray_address=address, selection=selection).run()
    except OSError as exc:  # the catalog, mid-run (a stage's own are StageFailed)
        where = f" ({exc.filename})" if exc.filename else ""
        _fail(f"catalog {store.root.uri}: {exc.strerror or exc}{where}; nothing half-written was committed", 1)
    except Interrupted as exc:
        _fail(f"interrupted at {exc.at or 'the start'}; run the same command to resume", 128 + exc.signum)
    except StageFailed as exc:
        details = exc.details
        try:
            store.root.put_atomic(details.encode(), "runs", loaded.name, "error.txt")
        except OSError as written:
            _fail(f"{exc}; its traceback could not be written to the catalog ({written.strerror or written})", 1)
        if debug:
            typer.echo(details, err=True)
        where = store.root.uri_of("runs", loaded.name, "error.txt")
        _fail(f"{exc} (traceback: {where}; nothing of it was committed; run again to resume)", 1)
    left = f", {summary.left_out} left out by the selection" if summary.left_out else ""
    typer.echo(f"run {summary.run}: {summary.ran} stages ran, {summary.cached} cached{left}, {summary.seconds:.1f}s")


@app.command()
@user_errors
def sweep(
    file: str,
    override: Overrides = None,
    catalog: CatalogOpt = None,
    address: AddressOpt = None,
) -> None:
    """Run a sweep (a base pipeline and a search space) with Ray Tune; print the
    trials ranked and the best overrides. `-o` adds fixed overrides to every trial.
    Re-run to resume: recorded trials are skipped."""
    import stages  # noqa: F401  (registers the stages)
    from catalog.store import Catalog
    from pipelines.session import Signals
    from pipelines.sweep import load_sweep, print_trials, run_sweep

    loaded = load_sweep(file, override or [])
    store = Catalog(catalog)
    t0 = time.time()
    signals = Signals()
    signals.install()
    try:
        rows = run_sweep(loaded, store, typer.echo, address, on_ray_start=signals.install)
    except KeyboardInterrupt as exc:  # Ray Tune re-raises a plain one: the handler kept the signal
        signum = getattr(exc, "signum", None) or signals.received or signal.SIGINT
        _fail(
            f"sweep {loaded.name} interrupted; recorded trials are kept: run the same command to resume", 128 + signum
        )
    finally:
        signals.restore()
    print_trials(loaded, rows, typer.echo)
    typer.echo(
        f"sweep {loaded.name}: {len(rows)} trial(s) in the catalog; this invocation took {time.time() - t0:.1f}s"
    )


@app.command()
@user_errors
def report(
    runs: Annotated[list[str], typer.Argument(help="run names; several are overlaid")],
    catalog: CatalogOpt = None,
    out: Annotated[
        str | None, typer.Option("--out", help="HTML file to write (default: reports/<run>[-vs-<run>...].html)")
    ] = None,
) -> None:
    """Write one self-contained HTML report of runs: curves with early warnings marked,
    stage timings, resolved specs, and a trajectory explorer."""
    from catalog.store import existing_catalog
    from pipelines.report import write_report

    target = Path(out or f"reports/{'-vs-'.join(runs)}.html")
    written = write_report(existing_catalog(catalog), list(runs), target)
    typer.echo(f"report: {written} (plots also in {written.with_suffix('')}/)")


@app.command()
@user_errors
def runs(catalog: CatalogOpt = None) -> None:
    """List the runs in the catalog (a running one with how far its step has got), with
    how many of their policy versions are stored whole (the others are kept in the
    run's trainer and rebuilt from their batches when read)."""
    from catalog.query import ask
    from catalog.store import existing_catalog

    answer = ask(
        existing_catalog(catalog),
        "select run, status, progress, iterations, seed, started_at, finished_at, spec_file, "
        "(select count(*) filter (where not r.in_memory) || ' of ' || count(*) from steps s join results r "
        "on r.key = s.key where s.run = runs.run and s.stage = 'update') as policies_stored "
        "from runs order by started_at",
    )
    _print_answer(answer, QueryFormat.table)


@app.command()
@user_errors
def verify(catalog: CatalogOpt = None) -> None:
    """Check every result of the catalog: its manifest (readable, well-formed, the one
    its runs recorded) and every file against it (size and SHA-256); exit 1 naming
    each result that does not match. Damaged results are marked: queries leave them
    out and the next run that needs one computes it again."""
    from catalog.store import existing_catalog
    from catalog.upkeep import verify as check_all

    store = existing_catalog(catalog)
    problems = check_all(store)
    for key, problem in problems:
        typer.echo(printable(f"result {key}: {problem}"), err=True)
    if problems:
        _fail(
            f"{len({k for k, _ in problems})} damaged results in {store.root.uri}, marked; the next run that "
            "needs one computes it again (pipeline gc removes what no run needs)",
            1,
        )
    typer.echo(f"ok: {len(store.result_keys())} results in {store.root.uri} match their manifests")


@app.command()
@user_errors
def gc(
    catalog: CatalogOpt = None,
    apply: Annotated[bool, typer.Option("--apply", help="delete (default: only list what would go)")] = False,
    older_than: Annotated[
        float, typer.Option("--older-than", help="minutes after which a staging folder is a leftover")
    ] = 60.0,
    optimizer_states: Annotated[
        bool,
        typer.Option(
            "--optimizer-states",
            help="also the optimizer states a later update has continued (each run keeps its last; the weights stay)",
        ),
    ] = False,
) -> None:
    """List (or with --apply delete) what no run needs: staging leftovers and results
    that no run's steps reference, directly or as an input; with --optimizer-states,
    also every optimizer state that a later committed update has continued."""
    from catalog.store import existing_catalog
    from catalog.upkeep import garbage, prune_states, remove, superseded_states

    store = existing_catalog(catalog)
    for line in store.manifests()[1]:
        _note(line)
    found = garbage(store, older_than * 60)
    states = superseded_states(store, older_than * 60) if optimizer_states else []
    if apply:
        found = remove(store, found, older_than * 60)
        states = prune_states(store, states, older_than * 60)
    for name, size in found.staging:
        typer.echo(printable(f"{'removed ' if apply else ''}_staging/{name}  {size / 2**20:.1f} MiB"))
    for key, size in found.results:
        typer.echo(printable(f"{'removed ' if apply else ''}results/{key}  {size / 2**20:.1f} MiB"))
    for key, rel, size in states:
        typer.echo(printable(f"{'removed ' if apply else ''}results/{key}/{rel}  {size / 2**20:.1f} MiB"))
    total = len(found.staging) + len(found.results) + len(states)
    verb = "removed" if apply else "would remove (run again with --apply)"
    optimizer = f"{len(states)} continued optimizer states, " if optimizer_states else ""
    size = found.bytes + sum(n for *_, n in states)
    typer.echo(
        f"{verb}: {len(found.staging)} staging leftovers, {len(found.results)} unreferenced results, "
        f"{optimizer}{size / 2**20:.1f} MiB"
        if total
        else "nothing to remove"
    )


@app.command("query")
@user_errors
def query_cmd(
    sql: str,
    catalog: CatalogOpt = None,
    format: Annotated[QueryFormat, typer.Option("--format")] = QueryFormat.table,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=0, help="rows to print (default: 100 as a table, all as csv/json)"),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="seconds before the query is stopped")] = 300.0,
) -> None:
    """Run read-only SQL over the catalog's views: runs, steps, metrics, results, and
    the stages' table views (e.g. trajectories). SIGINT or SIGTERM stops it."""
    from catalog.query import Abandoned, ask
    from catalog.store import existing_catalog

    if limit is None and format == QueryFormat.table:
        limit = 100
    received: list[int] = []

    def interrupt(signum: int, frame: Any) -> None:
        received.append(signum)
        raise Interrupted(signum)

    # both signals get a handler: a SIGINT ignored by the parent process is ignored here too otherwise
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        answer = ask(existing_catalog(catalog), sql, limit=limit, timeout=timeout)
    except Abandoned as exc:  # DuckDB still holds the query's thread: leave without it
        typer.echo("error: query interrupted", err=True)
        sys.stderr.flush()
        os._exit(128 + exc.signum)
    except KeyboardInterrupt as exc:
        _fail("query interrupted", 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT))
    except Exception:
        if received:  # met inside a DuckDB call while the views were made: its own "Query interrupted" error
            _fail("query interrupted", 128 + received[-1])
        raise
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(s, handler)
    _print_answer(answer, format)


def _print_answer(answer: Any, format: QueryFormat) -> None:
    for note in answer.notes:
        _note(note)
    table = answer.table
    if format == QueryFormat.csv:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        for i, field in enumerate(table.schema):
            if pa.types.is_nested(field.type) or pa.types.is_binary(field.type):
                encoded = [None if v is None else json.dumps(v, default=str) for v in table.column(i).to_pylist()]
                table = table.set_column(i, field.name, pa.array(encoded, pa.string()))
        pacsv.write_csv(table, sys.stdout.buffer)
    elif format == QueryFormat.json:
        typer.echo(json.dumps(table.to_pylist(), default=str, indent=1))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        out = Table(*(escape(printable(c)) for c in table.column_names))
        for row in table.to_pylist():
            out.add_row(
                *(
                    escape(printable("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)))
                    for v in row.values()
                )
            )
        Console(width=200).print(out)
        typer.echo(
            f"({answer.total} rows)"
            if not answer.hidden
            else f"({answer.total} rows; the last {answer.hidden} not shown: --limit)"
        )
    if answer.hidden and format != QueryFormat.table:
        _note(f"{answer.hidden} of {answer.total} rows not printed (--limit)")


def invoke(argv: list[str] | None = None) -> int:
    """Run one command line (``sys.argv`` by default) and return its exit status."""
    try:
        code = app(args=argv, prog_name="pipeline", standalone_mode=False)  # `typer.Exit(n)` comes back as n
    except Exception as exc:
        answered = usage_error(exc)
        if answered is None:
            raise
        return answered
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """The console script. It leaves without the interpreter's teardown once the
    command is done (`pipelines.cli_common.leave`): the native thread pools of Arrow and
    DuckDB can abort a finished command there ("terminate called without an active
    exception", exit -6), after every file was written."""
    from pipelines.cli_common import leave

    leave(invoke())


from pipelines import cli_more  # noqa: E402, F401  (registers diff and score on `app`)
