"""The early warnings against falls, on runs they were designed on and runs they were not.

A fall is read from the rollouts alone (`pipelines.run.watch.first_fall`): the first
iteration whose mean rollout success over a window is 20 points below the best such mean
before it. The window is the run's own: enough iterations that the mean's noise is about 5
points (at least 3), from the spread of successive iterations (FrozenLake's 16 lakes an
iteration swing its success by about 12 points; the bandit's 32 episodes by about 9). Each run's stored metrics go through every rule of `pipelines.run.watch` at its
default threshold (`replay`), through all of them at once, and through RAGEN-2's stop rule
(the in-group reward std below 10% of its first value for 10 iterations in a row), beside
the rule a reviewer would try first: a clock (a warning every `--lead` iterations, whatever
the run does). For each rule and each half of the runs it prints:

- `falls warned`: falls with a warning at most `--lead` iterations before them, or at them;
- `lead`: for those, the iterations from the first such warning to the fall (median);
- `false alarms / 100 it.`: warnings with no fall in the `--lead` iterations after them,
  per 100 iterations of the runs.

Each run is in one half, named on the command line: `design` (the rules were tuned on
it) or `held-out` (never looked at while tuning them). Nothing here tunes a rule.

    python experiments/warning_table.py --record smollm2-bandit-collapse:design \\
        --run /tmp/cat96:odds-s0:held-out --run /tmp/cat94:starpo:held-out --save warning-table
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import metrics_by_iteration
from catalog.store import existing_catalog
from common.recording import Recorder, run_script
from pipelines.run.watch import first_fall, replay
from pipelines.spec.rules import RULES, settings_given

RESULTS = Path(__file__).resolve().parent / "results"
HALVES = ("design", "held-out")
#: the noise a mean of rollout success may keep: a fall is 4 of them (20 points)
NOISE = 0.05
#: the clock: a warning every `--lead` iterations, whatever the run does (what a rule must beat)
CLOCK = "clock"
#: RAGEN-2's stop rule: the std below this share of its baseline ...
RAGEN_SHARE = 0.1
#: ... for this many iterations in a row
RAGEN_RUN = 10


@dataclass
class Run:
    name: str
    half: str
    metrics: dict[int, dict[str, float]]

    @property
    def iterations(self) -> list[int]:
        return sorted(i for i, m in self.metrics.items() if m.get("rollout/success_rate") is not None)

    @property
    def success(self) -> list[float]:
        return [self.metrics[i]["rollout/success_rate"] for i in self.iterations]

    def window(self) -> int:
        """Iterations a mean needs for its noise to be about NOISE (at least 3): the
        per-iteration noise read from the median successive difference (robust: a trend
        or the fall itself barely moves it)."""
        s = self.success
        if len(s) < 2:
            return 3
        sigma = 1.4826 * statistics.median(abs(b - a) for a, b in itertools.pairwise(s)) / math.sqrt(2)
        return max(3, math.ceil((sigma / NOISE) ** 2))

    def fall(self) -> int | None:
        """The iteration the run fell at (None: it never fell): its mean success over
        `window` iterations 20 points below the best such mean before."""
        k = first_fall(self.success, window=self.window())
        return None if k is None else self.iterations[k]


def ragen_stop(run: Run) -> list[tuple[int, str]]:
    """RAGEN-2's stop: the iteration the in-group std has stayed below RAGEN_SHARE of its
    first value for RAGEN_RUN iterations in a row (once)."""
    series = [(i, run.metrics[i].get("rollout/in_group_std")) for i in run.iterations]
    values = [(i, v) for i, v in series if v is not None]
    if not values or values[0][1] <= 0:
        return []
    base, low = values[0][1], 0
    for i, v in values:
        low = low + 1 if v < RAGEN_SHARE * base else 0
        if low == RAGEN_RUN:
            return [(i, "ragen_stop")]
    return []


def from_record(name: str, half: str) -> list[Run]:
    """The runs of a collapse record (experiments/collapse.py): per-iteration series of a
    few metrics, indexed from iteration 0."""
    data = json.loads((RESULTS / f"{name}.json").read_text())["data"]
    runs = []
    for recipe, listed in data.items():
        for entry in listed:
            metrics: dict[int, dict[str, float]] = {}
            for k, row in enumerate(entry["rows"]):
                metrics[k] = {
                    "rollout/success_rate": row["success"],
                    "rollout/in_group_std": row.get("in_group_std"),
                    "actor/entropy": row.get("entropy"),
                    "actor/grad_norm": row.get("grad_norm"),
                }
                metrics[k] = {m: v for m, v in metrics[k].items() if v is not None}
            runs.append(Run(f"{recipe} s{entry['seed']}", half, metrics))
    return runs


def score(runs: list[Run], fired: dict[str, list[int]], lead: int) -> dict[str, object]:
    """One rule on some runs: falls, falls warned, median lead, false alarms per 100 iterations."""
    falls = warned = alarms = iterations = 0
    leads: list[int] = []
    for run in runs:
        fall, its = run.fall(), fired.get(run.name, [])
        iterations += len(run.iterations)
        before = [i for i in its if fall is not None and fall - lead <= i <= fall]
        if fall is not None:
            falls += 1
            if before:
                warned += 1
                leads.append(fall - min(before))
        alarms += sum(1 for i in its if fall is None or not (i <= fall <= i + lead))
    return {
        "runs": len(runs),
        "iterations": iterations,
        "falls": falls,
        "warned": warned,
        "lead": statistics.median(leads) if leads else None,
        "false_per_100": 100 * alarms / iterations if iterations else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], help="CATALOG:RUN:HALF (a stored run)")
    ap.add_argument("--record", action="append", default=[], help="NAME:HALF (a collapse record's runs)")
    ap.add_argument("--lead", type=int, default=10, help="iterations before a fall a warning counts for it")
    ap.add_argument("-s", "--set", action="append", default=[], help="a threshold, field=value (null: off)")
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    try:
        cfg = settings_given(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    runs: list[Run] = []
    for item in args.record:
        name, _, half = item.rpartition(":")
        if half not in HALVES:
            ap.error(f"--record {item}: expected NAME:{'|'.join(HALVES)}")
        runs += from_record(name, half)
    for item in args.run:
        root, run, half = item.rsplit(":", 2) if item.count(":") >= 2 else ("", "", "")
        if half not in HALVES:
            ap.error(f"--run {item}: expected CATALOG:RUN:{'|'.join(HALVES)}")
        runs.append(Run(run, half, metrics_by_iteration(existing_catalog(root), run)))
    if not runs:
        ap.error("name the runs: --run CATALOG:RUN:HALF or --record NAME:HALF")
    events = {
        run.name: replay(run.metrics, cfg)
        + ragen_stop(run)
        + [(i, CLOCK) for i in run.iterations[args.lead - 1 :: args.lead]]
        for run in runs
    }
    out = Recorder()
    out.line("| run | half | iterations | window | fell at | warnings (iteration rule) |")
    out.line("|---|---|---|---|---|---|")
    for run in runs:
        shown = ", ".join(f"{i} {rule}" for i, rule in events[run.name]) or "none"
        fall = run.fall()
        out.line(
            f"| {run.name} | {run.half} | {len(run.iterations)} | {run.window()} | {'-' if fall is None else fall} "
            f"| {shown} |"
        )
    out.line("")
    out.line(
        f"| rule | half | runs | falls | falls warned (<= {args.lead} it. before) | lead (median) | false alarms / 100 it. |"
    )
    out.line("|---|---|---|---|---|---|---|")
    names = [*sorted({r.name for r in RULES}), "any rule", "ragen_stop", CLOCK]
    rows = []
    for rule in names:
        for half in HALVES:
            these = [r for r in runs if r.half == half]
            if not these:
                continue
            fired = {
                r.name: sorted(
                    {
                        i
                        for i, name in events[r.name]
                        if name == rule or (rule == "any rule" and name not in ("ragen_stop", CLOCK))
                    }
                )
                for r in these
            }
            s = score(these, fired, args.lead)
            rows.append({"rule": rule, "half": half, **s})
            lead = "-" if s["lead"] is None else f"{s['lead']:g}"
            false = "-" if s["false_per_100"] is None else f"{s['false_per_100']:.1f}"
            out.line(f"| {rule} | {half} | {s['runs']} | {s['falls']} | {s['warned']} | {lead} | {false} |")
    if args.save:
        listed = [
            {
                "run": r.name,
                "half": r.half,
                "iterations": len(r.iterations),
                "fell_at": r.fall(),
                "warnings": events[r.name],
            }
            for r in runs
        ]
        out.save(args.save, data={"runs": listed, "rules": rows, "lead": args.lead})


if __name__ == "__main__":
    run_script(main)
