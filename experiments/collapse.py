"""Collapse, or its absence, per iteration: two recipes (e.g. vanilla StarPO and
StarPO-S) at several run seeds, side by side on the diagnostics the paper reads for the
Echo Trap. For each run it prints, per iteration, the rollout's success, the reward's std
within groups, the policy entropy, the gradient norm, the share of duplicate responses
within a group (with thinking on, mostly the reasoning), and the warnings that fired;
then per recipe the mean at the first and the last iteration, and for each run the
iteration its success first fell (a 3-iteration mean 20 points below the best before) and the one its first warning fired (does the warning
come first?). `--out` draws the five series, one line a run, coloured by recipe.

    python experiments/collapse.py --catalog ROOT \\
        --recipe vanilla=sweep:seeds-smollm2-bandit-vanilla --recipe StarPO-S=sweep:seeds-smollm2-bandit \\
        [--out docs/images/smollm2-bandit-collapse.png] [--save smollm2-bandit-collapse]

A recipe is `LABEL=sweep:NAME` (the sweep's trials, runs NAME-<trial id>) or
`LABEL=RUN[,RUN...]` (these runs).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script
from pipelines.run.watch import first_fall

#: the series, as (column, metric name, heading)
SERIES = [
    ("success", "rollout/success_rate", "rollout success"),
    ("in_group_std", "rollout/in_group_std", "reward std within groups"),
    ("entropy", "actor/entropy", "policy entropy (nats)"),
    ("grad_norm", "actor/grad_norm", "gradient norm"),
    ("dup_in_group", "collapse/duplicate_rate_group", "duplicate responses within a group"),
]

PER_ITERATION = (
    "with m as (select run, iteration, "
    + ", ".join(f"max(case when name = '{metric}' then value end) as {col}" for col, metric, _ in SERIES)
    + " from metrics where {which} and iteration is not null group by all), "
    "w as (select run, iteration, string_agg(distinct rule, ' ' order by rule) as warnings from events where {which} group by all) "
    "select r.seed, m.*, coalesce(w.warnings, '') as warnings from m join runs r using (run) "
    "left join w using (run, iteration) where m.success is not null order by r.seed, m.run, m.iteration"
)

EVALS = (
    "select run, policy_version as version, avg(success::int) as success from evals "
    "where {which} and temperature = {temperature} {env} group by all order by all"
)


def which_runs(recipe: str) -> str:
    """The SQL condition on `run` of a recipe's value (`sweep:NAME` or `RUN[,RUN...]`)."""
    if recipe.startswith("sweep:"):
        name = re.escape(recipe.removeprefix("sweep:")).replace("'", "")
        return f"regexp_full_match(run, '{name}-[0-9a-f]+')"
    names = [n.strip().replace("'", "") for n in recipe.split(",") if n.strip()]
    return "run in (" + ", ".join(f"'{n}'" for n in names) + ")"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--recipe", action="append", required=True, help="LABEL=sweep:NAME or LABEL=RUN[,RUN...]")
    ap.add_argument("--env", default=None, help="the eval env drawn (default: every env the runs evaluate on)")
    ap.add_argument("--temperature", type=float, default=0.5, help="the eval temperature drawn")
    ap.add_argument("--out", default=None, help="draw the series and eval success into this PNG")
    ap.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    args = ap.parse_args()
    catalog = existing_catalog(args.catalog)
    out = Recorder()
    runs: dict[str, list[dict]] = {}  # label -> one dict per run: seed, run, and its series
    for spec in args.recipe:
        label, sep, value = spec.partition("=")
        if not sep or not label or not value:
            raise SystemExit(f"error: --recipe {spec!r}: expected LABEL=sweep:NAME or LABEL=RUN[,RUN...]")
        rows = query(catalog, PER_ITERATION.format(which=which_runs(value))).to_pylist()
        if not rows:
            raise SystemExit(f"error: --recipe {spec!r}: no run of it with rollouts in the catalog")
        by_run: dict[str, dict] = {}
        for row in rows:
            run = by_run.setdefault(row["run"], {"seed": row["seed"], "run": row["run"], "rows": []})
            run["rows"].append(row)
        env = f"and env = '{args.env.replace(chr(39), '')}'" if args.env else ""
        sql = EVALS.format(which=which_runs(value), temperature=float(args.temperature), env=env)
        for row in query(catalog, sql).to_pylist():
            if row["run"] in by_run:
                by_run[row["run"]].setdefault("evals", []).append((row["version"], row["success"]))
        runs[label] = list(by_run.values())
    columns = ["iteration", *(c for c, _, _ in SERIES), "warnings"]
    for label, group in runs.items():
        for run in group:
            evals = ", ".join(f"v{v} {100 * x:.1f}%" for v, x in run.get("evals", []))
            out.line(f"{label}, seed {run['seed']} ({run['run']}); eval success {evals or 'none'}")
            out.line("| " + " | ".join(columns) + " |")
            out.line("|" + "---|" * len(columns))
            for row in run["rows"]:
                cells = [row["iteration"], *(row[c] for c, _, _ in SERIES), row["warnings"]]
                out.line("| " + " | ".join(_cell(x) for x in cells) + " |")
            out.line()
    out.line(
        "mean over seeds, first and last iteration; the first fall of success (its mean over 3 iterations 20 points below the best before) and the first warning"
    )
    out.line(
        "| recipe | seeds | "
        + " | ".join(f"{h} (first -> last)" for _, _, h in SERIES)
        + " | falls at | first warning |"
    )
    out.line("|" + "---|" * (len(SERIES) + 4))
    for label, group in runs.items():
        cells = []
        for col, _, _ in SERIES:
            first = [r["rows"][0][col] for r in group if r["rows"][0][col] is not None]
            last = [r["rows"][-1][col] for r in group if r["rows"][-1][col] is not None]
            cells.append(f"{_cell(_mean(first))} -> {_cell(_mean(last))}")
        falls, warns = [], []
        for r in group:
            fall = first_fall([row["success"] for row in r["rows"]])
            falls.append("-" if fall is None else str(r["rows"][fall]["iteration"]))
            warned = next((row["iteration"] for row in r["rows"] if row["warnings"]), None)
            warns.append("-" if warned is None else str(warned))
        seeds = ", ".join(str(r["seed"]) for r in group)
        out.line(f"| {label} | {seeds} | " + " | ".join(cells) + f" | {', '.join(falls)} | {', '.join(warns)} |")
    if args.save:
        out.save(args.save, runs)
    if args.out:
        draw(runs, args.out, args.env)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _cell(x: object) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def draw(runs: dict[str, list[dict]], path: str, env: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(10.5, 6.0), dpi=100)
    axes, last = list(grid.flat[: len(SERIES)]), grid.flat[len(SERIES)]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (label, group), colour in zip(runs.items(), colours, strict=False):
        for n, run in enumerate(group):
            its = [row["iteration"] for row in run["rows"]]
            for ax, (col, _, heading) in zip(axes, SERIES, strict=True):
                ys = [row[col] for row in run["rows"]]
                ax.plot(its, ys, color=colour, alpha=0.8, linewidth=1.2, marker=".", label=label if n == 0 else None)
                warned = [
                    (i, y) for i, y, row in zip(its, ys, run["rows"], strict=True) if row["warnings"] and y is not None
                ]
                if warned:
                    ax.scatter(*zip(*warned, strict=True), color=colour, marker="x", s=30)
                ax.set_title(heading, fontsize=9)
                ax.set_xlabel("iteration", fontsize=8)
                ax.grid(alpha=0.3)
            if run.get("evals"):
                last.plot(*zip(*run["evals"], strict=True), color=colour, alpha=0.8, linewidth=1.2, marker="o")
    last.set_title(f"eval success by policy version{f' ({env})' if env else ''}", fontsize=9)
    last.set_xlabel("policy version", fontsize=8)
    last.set_ylim(-0.02, 1.02)
    last.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    fig.suptitle("one line a run seed; x: an iteration where a warning fired", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"drawn: {path}")


if __name__ == "__main__":
    run_script(main)
