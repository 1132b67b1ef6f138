"""`pipeline validate`, `explain` and `show`: a spec checked, its settings and its graph,
with nothing run."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.app import (
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


class ShowFormat(StrEnum):
    text = "text"
    mermaid = "mermaid"


@app.command()
@user_errors
def validate(spec: str, override: Overrides = None, imports: Imports = None) -> None:
    """Check a spec without running anything: keys, types, ranges, names, wiring. A
    sweep file is checked as `pipeline sweep` checks it: every trial's spec and the metric."""
    from pipelines.sweep.file import is_sweep_file, validated

    if is_sweep_file(spec):
        import stages  # noqa: F401  (registers the stages)
        from pipelines.spec.imports import import_modules

        import_modules(tuple(imports or ()), [Path.cwd()], "--import")
        sweep, trials = validated(spec, override or ())
        typer.echo(f"ok: {sweep.file}: a sweep of {trials} trial(s) of {sweep.base}")
        return
    loaded = load(spec, override, imports)
    typer.echo(f"ok: {loaded.file}: {len(loaded.nodes)} stages, {loaded.run.iterations} iterations")
    typer.echo(_resources(loaded))


def _resources(spec: Any) -> str:
    """The spec's resource plan in one line (`pipelines.graph.resources`), checked against
    the cluster where an address is known (``ray.address``, ``$RAY_ADDRESS``)."""
    from pipelines.graph import resources

    need = resources.of_spec(spec)
    address = spec.ray.address or os.environ.get("RAY_ADDRESS")
    if address and (need.gpus or need.cpus):
        import ray

        from pipelines.run.session import start_ray

        start_ray(address)
        try:
            resources.check(need, ray.cluster_resources(), f"the Ray cluster at {address}")
        finally:
            ray.shutdown()
        return need.describe() + f"; the cluster at {address} has them"
    return need.describe()


@app.command()
@user_errors
def explain(
    spec: str, key: Annotated[str | None, typer.Argument()] = None, override: Overrides = None, imports: Imports = None
) -> None:
    """Print every setting (or those under KEY, e.g. `rollout` or `update.optim.lr`)
    with its value, doc, bounds, the paper's value and the file or override that set it."""
    from pipelines.spec.explain import explain as text

    typer.echo(text(load(spec, override, imports), key))


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
    from pipelines.graph.dag import build_graph
    from pipelines.graph.show import render_mermaid, render_text, would_run

    loaded = load(spec, override, imports)
    graph = build_graph(loaded)
    if format == ShowFormat.mermaid:
        typer.echo(render_mermaid(graph))
        return
    status = None
    if catalog is not None or to or only or start:
        from pipelines.graph.select import Selection

        status = would_run(loaded, graph, catalog, Selection.of(to or (), only or (), start or ()))
    typer.echo(render_text(graph, loaded.run.iterations, status))
