"""`pipeline run`, `sweep` and `report`: runs, sweeps of runs, and their HTML report."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from common.errors import Interrupted, StageFailed, UserError
from pipelines.cli.app import (
    AddressOpt,
    CatalogOpt,
    FromOpt,
    Imports,
    OnlyOpt,
    Overrides,
    ToOpt,
    app,
    load,
    user_errors,
)
from pipelines.cli.app import fail as _fail


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
    from pipelines.graph.select import Selection
    from pipelines.run.progress import RichDisplay
    from pipelines.run.runner import Runner

    loaded = load(spec, override, imports)
    store = Catalog(catalog or loaded.catalog.root)
    selection = Selection.of(to or (), only or (), start or ())
    try:
        summary = Runner(loaded, store, RichDisplay(), ray_address=address, selection=selection, keep_ray=False).run()
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
    Re-run to resume: recorded trials are skipped (run again where the base spec or code changed since)."""
    import stages  # noqa: F401  (registers the stages)
    from catalog.store import Catalog
    from pipelines.run.session import Signals
    from pipelines.sweep.tune import load_sweep, print_trials, run_sweep

    loaded = load_sweep(file, override or [])
    store = Catalog(catalog)
    t0 = time.time()
    signals = Signals()
    signals.install()
    try:
        rows = run_sweep(
            loaded,
            store,
            typer.echo,
            address,
            on_ray_start=signals.install,
            check_signals=signals.check,
            keep_ray=False,
        )
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
    runs: Annotated[list[str] | None, typer.Argument(help="run names; several are overlaid")] = None,
    catalog: CatalogOpt = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            metavar="FILE",
            help="HTML file to write (default: reports/<run>[-vs-<run>...].html, reports/<sweep>.html)",
        ),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            "--sweep", metavar="NAME", help="instead of runs: a sweep's levels overlaid, each level's seeds a band"
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML report of runs: curves with early warnings marked,
    stage timings, resolved specs, and a trajectory explorer. With --sweep: the sweep's
    levels, each the mean of its seeds with the 95% interval, and a table of the levels."""
    from catalog.store import existing_catalog

    if sweep is not None and runs:
        raise UserError("report: give run names or --sweep, not both")
    if sweep is not None:
        from pipelines.report.levels import write_sweep_report

        written = write_sweep_report(existing_catalog(catalog), sweep, Path(out or f"reports/{sweep}.html"))
        typer.echo(f"report: {written} (plot also in {written.with_suffix('.png')})")
        return
    if not runs:
        raise UserError("report: give one or more run names (pipeline runs lists them), or --sweep NAME")
    from pipelines.report.page import write_report

    target = Path(out or f"reports/{'-vs-'.join(runs)}.html")
    written = write_report(existing_catalog(catalog), list(runs), target)
    plots = written.with_suffix("")
    if plots.is_dir() and any(plots.glob("*.png")):
        typer.echo(f"report: {written} (plots also in {plots}/)")
    else:
        typer.echo(f"report: {written} (no plots: the runs have no metrics yet)")
