"""Recipes of the main job side by side: what each run changed, what it cost, what it learned.

One row a run: the settings that differ from the first run named (as `pipeline diff` reads
them; the run's name and seed left out, the seed has its own column; so are settings the
first run's code did not have yet, unless the run set them), the seconds of its
stages by group, a metric of its pretraining (by default the held-out neighbour accuracy: how
well the model reads the cells around it), and eval success at T = 0.5 of the warm start (v0)
and of the last version.
The seconds are as from an empty catalog: a step the run found cached counts the seconds of
the run that computed it (the same key, in the same catalog), so runs that share a pretrained
model still each show what they would cost alone. Time outside the stages (start-up,
planning, Ray) is not counted.

    python experiments/recipes.py --catalog C --runs base-s1,more-epochs-s1 [--save main-job-recipes]
    python experiments/recipes.py --catalog C1 --catalog C2 --runs a,b    # each run from the first catalog that has it
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog, existing_catalog
from common.recording import Recorder, run_script
from pipelines.report.diff import differing_settings, recorded_settings

#: the table's stage groups, in order; any other stage counts as RL ("rl": rollout, update and the stages between)
GROUPS = ("pretrain", "warmstart", "rl", "eval")
#: the stages that are not RL iterations, by group (the model's build counts with its pretraining)
APART = {"policy.init": "pretrain", "pretrain": "pretrain", "warmstart": "warmstart", "eval": "eval"}
#: settings no recipe is about (the seed has its own column)
IGNORED = ("run.name", "run.seed")


@dataclass
class Row:
    """One run's recipe, cost and result."""

    run: str
    seed: int
    changes: list[str]
    seconds: dict[str, float] = field(default_factory=dict)
    success: dict[int, float] = field(default_factory=dict)  # policy version -> success at the temperature
    reads: float | None = None  # the pretraining metric
    uncounted: int = 0  # cached steps computed outside the catalog (counted at 0 s)


def _q(text: str) -> str:
    return text.replace("'", "''")


def _record(catalog: Catalog, run: str) -> dict[str, Any] | None:
    rows = query(catalog, f"select * from runs where run = '{_q(run)}'").to_pylist()
    return rows[0] if rows else None


def by_group(steps: list[dict[str, Any]]) -> tuple[dict[str, float], int]:
    """Seconds by group of a run's steps (`stage`, `status`, `seconds`, and `computed`: the
    seconds of a run that ran the same key), a cached step counted at `computed`; and how many
    cached steps no run in the catalog computed (counted at 0: the table says so)."""
    out = dict.fromkeys(GROUPS, 0.0)
    uncounted = 0
    for r in steps:
        spent = r["seconds"] if r["status"] == "ran" else r.get("computed")
        uncounted += spent is None
        out[APART.get(r["stage"], "rl")] += float(spent or 0.0)
    return out, uncounted


def seconds(catalog: Catalog, run: str) -> tuple[dict[str, float], int]:
    """`by_group` of `run`'s steps in `catalog`."""
    rows = query(
        catalog,
        "select s.stage, s.status, s.seconds, (select max(o.seconds) from steps o where o.key = s.key and "
        f"o.status = 'ran') computed from steps s where s.run = '{_q(run)}'",
    ).to_pylist()
    return by_group(rows)


def _value(text: str | None) -> str:
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return str(text)
    return "-" if value is None else json.dumps(value) if isinstance(value, dict | list) else str(value)


def changes(base: dict[str, dict[str, str]], other: dict[str, dict[str, str]]) -> list[str]:
    """`path=value` of each recorded setting of `other` that differs from `base`'s; the
    run's name and seed left out, and a setting `base`'s code did not have yet unless
    `other` set it (its source is not "default")."""
    return [
        f"{s.path}={_value(s.b)}"
        for s in differing_settings(base, other)
        if s.path not in IGNORED and (s.a is not None or s.b_source != "default")
    ]


def metric(catalog: Catalog, run: str, name: str) -> float | None:
    """The run's value of metric `name` (a cached step's metrics are the run's too)."""
    rows = query(
        catalog, f"select value from metrics where run = '{_q(run)}' and name = '{_q(name)}' limit 1"
    ).to_pylist()
    return float(rows[0]["value"]) if rows else None


def success(catalog: Catalog, run: str, temperature: float) -> dict[int, float]:
    rows = query(
        catalog,
        f"select policy_version v, avg(success::int) s from evals where run = '{_q(run)}' and "
        f"temperature = {float(temperature)} group by 1 order by 1",
    ).to_pylist()
    return {int(r["v"]): float(r["s"]) for r in rows}


def eval_success(catalog: Catalog, run: str, temperature: float) -> dict[int, float]:
    """Success by version; where the run found the warm start's eval cached, v0 from the
    run that computed it."""
    found = success(catalog, run, temperature)
    if found and 0 not in found:
        shared = query(
            catalog,
            "select o.run from steps s join steps o on o.key = s.key and o.status = 'ran' "
            f"where s.run = '{_q(run)}' and s.node = 'eval_start' limit 1",
        ).to_pylist()
        v0 = success(catalog, shared[0]["run"], temperature).get(0) if shared else None
        if v0 is not None:
            found[0] = v0
    return dict(sorted(found.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", action="append", default=None, help="catalog root (repeatable)")
    ap.add_argument("--runs", required=True, help="runs, comma-separated; the first is the one the others change")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--metric", default="pretrain/frozenlake/neighbour", help="the pretraining metric shown")
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    catalogs = [existing_catalog(c) for c in (args.catalog or [None])]
    names = [r.strip() for r in args.runs.split(",") if r.strip()]
    found: dict[str, tuple[Catalog, dict[str, Any]]] = {}
    for name in names:
        for c in catalogs:
            record = _record(c, name)
            if record is not None:
                found[name] = (c, record)
                break
        else:
            sys.exit(f"error: --runs: no run '{name}' in {', '.join(str(c.root) for c in catalogs)}")
    base = recorded_settings(found[names[0]][1])
    rows = []
    for name in names:
        catalog, record = found[name]
        spent, uncounted = seconds(catalog, name)
        row = Row(name, int(record["seed"]), changes(base, recorded_settings(record)), spent, uncounted=uncounted)
        row.success = eval_success(catalog, name, args.temperature)
        row.reads = metric(catalog, name, args.metric)
        rows.append(row)
    out = Recorder()
    out.line(
        f"eval success at T = {args.temperature:g}; seconds as from an empty catalog; changes against {names[0]}; "
        f"reads: {args.metric}"
    )
    out.line()
    out.line("| run | seed | changes | pretrain s | warm start s | RL s | eval s | stages s | reads | v0 | last |")
    out.line("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        last = max(r.success) if r.success else None
        v0 = f"{100 * r.success[0]:.1f}%" if 0 in r.success else "-"
        end = f"{100 * r.success[last]:.1f}% (v{last})" if last is not None else "-"
        cost = " | ".join(f"{r.seconds[g]:.0f}" for g in GROUPS)
        reads = f"{r.reads:.2f}" if r.reads is not None else "-"
        out.line(
            f"| {r.run} | {r.seed} | {', '.join(r.changes) or '-'} | {cost} | {sum(r.seconds.values()):.0f}"
            + (f" ({r.uncounted} steps cached from elsewhere: 0 s)" if r.uncounted else "")
            + f" | {reads} "
            f"| {v0} | {end} |"
        )
    if args.save:
        out.save(
            args.save,
            {
                "temperature": args.temperature,
                "metric": args.metric,
                "rows": [
                    {
                        "run": r.run,
                        "seed": r.seed,
                        "changes": r.changes,
                        "seconds": r.seconds,
                        "success": {str(k): v for k, v in r.success.items()},
                        "reads": r.reads,
                        "uncounted": r.uncounted,
                    }
                    for r in rows
                ],
            },
        )


if __name__ == "__main__":
    run_script(main)
