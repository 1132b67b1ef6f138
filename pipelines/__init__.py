"""The declarative layer: a spec read and checked, its graph planned against the
catalog, the run that executes it, sweeps of runs, reports, and the `pipeline` CLI.

Six rooms, bottom to top; each imports only the rooms below it (and `common`,
`catalog`, `envs`, `stages`), as `tests/test_architecture.py` checks:

    spec     YAML in, one typed and frozen `Spec` out; `explain`
    graph    the DAG of a spec, the plan of steps against the catalog, selections, `show`
    report   HTML reports, run diffs and policy scores, read from the catalog
    run      the runner: steps, hooks, progress, early warnings, tracking, the Ray session
    sweep    a sweep file and its trials under Ray Tune
    cli      the `pipeline` command

Nothing imports this package except the CLI entry point, scripts and tests.
"""
