"""`pipeline runs`, `verify`, `gc`, `query` and `diff`: what a catalog holds, checked,
cleaned, asked and compared."""

from __future__ import annotations

import json
import os
import signal
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from common.errors import Interrupted
from common.terminal import terminal_width
from pipelines.cli.app import (
    CatalogOpt,
    app,
    policy_version,
    printable,
    user_errors,
)
from pipelines.cli.app import fail as _fail
from pipelines.cli.app import note as _note


class QueryFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


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
        float,
        typer.Option(
            "--older-than",
            metavar="MINUTES",
            help="minutes after which a staging folder is a leftover (on an object store, also an unreferenced result)",
        ),
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
        typer.Option("--limit", metavar="ROWS", min=0, help="rows to print (default: 100 as a table, all as csv/json)"),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", metavar="SECONDS", min=0.001, help="seconds before the query is stopped")
    ] = 300.0,
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

        out = Table()
        for c in table.column_names:  # a long value folds onto the next line, never cut
            out.add_column(escape(printable(c)), overflow="fold")
        for row in table.to_pylist():
            out.add_row(
                *(
                    escape(printable("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)))
                    for v in row.values()
                )
            )
        Console(width=terminal_width()).print(out)
        typer.echo(
            f"({answer.total} rows)"
            if not answer.hidden
            else f"({answer.total} rows; the last {answer.hidden} not shown: --limit)"
        )
    if answer.hidden and format != QueryFormat.table:
        _note(f"{answer.hidden} of {answer.total} rows not printed (--limit)")


@app.command()
@user_errors
def diff(run_a: str, run_b: str, catalog: CatalogOpt = None) -> None:
    """What differs between two runs: settings (with their sources), shared steps,
    where the curves part beyond noise, and one validation seed played by both."""
    from catalog.store import existing_catalog
    from pipelines.report.diff import diff_runs, render

    for line in render(diff_runs(existing_catalog(catalog), run_a, run_b)).splitlines():
        typer.echo(printable(line))


class ExportFormat(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"
    ragen = "ragen"
    atif = "atif"


@app.command()
@user_errors
def export(
    out: Annotated[str, typer.Argument(metavar="OUT", help="the file to write (.jsonl or .parquet)")],
    catalog: CatalogOpt = None,
    run: Annotated[
        list[str] | None, typer.Option("--run", metavar="RUN", help="episodes of this run (repeatable; default: all)")
    ] = None,
    view: Annotated[
        str, typer.Option("--view", metavar="VIEW", help="trajectories (rollouts), evals or demonstrations")
    ] = "trajectories",
    version: Annotated[
        int | None,
        typer.Option("--version", metavar="VERSION", parser=policy_version, help="played by this policy version"),
    ] = None,
    success: Annotated[
        bool | None, typer.Option("--success/--failure", help="only the episodes that succeeded (or failed)")
    ] = None,
    split: Annotated[str | None, typer.Option("--split", metavar="SPLIT", help="train or validation")] = None,
    where: Annotated[
        str | None, typer.Option("--where", metavar="SQL", help="a condition of your own on the view's columns")
    ] = None,
    format: Annotated[
        ExportFormat | None,
        typer.Option("--format", help="default: from OUT's suffix; ragen and atif: those projects' JSON Lines"),
    ] = None,
) -> None:
    """Write stored episodes as chat data: OpenAI messages, one episode a record, with
    its reward, success, the filter's decision and per turn its advantage and
    log-probabilities as metadata (docs/trajectories.md, "Export"); JSON Lines, or
    Parquet that Hugging Face datasets loads as it is, or RAGEN's rollout JSONL or ATIF
    trajectories (`pipelines.report.formats`)."""
    from pathlib import Path

    from catalog.store import existing_catalog
    from pipelines.report.export import Filters, episodes, write

    target = Path(out)
    kind = format.value if format else ("parquet" if target.suffix == ".parquet" else "jsonl")
    filters = Filters(tuple(run or ()), version, success, split, where)
    n = write(episodes(existing_catalog(catalog), view, filters), target, kind)
    if n == 0:
        _note(f"export: no episode of {view} matched; {target} holds none")
    typer.echo(f"export: {n} episodes to {target} ({kind})")
