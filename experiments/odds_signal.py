"""What the update of a bandit run with odds drawn at each reset had to learn from.

For each run and block of iterations, over its training rollouts (the episodes RL
sampled, each replayed to its first state for its odds):

- `better arm, gamble better` / `gamble worse`: the share of episodes that picked the arm
  with the larger expectation, on draws where the gamble is the better and the worse arm.
  A policy that compares scores high on both; "answer the gamble" scores 100% and 0%;
- `groups split`: the share of groups (the episodes of one state) whose members did not all
  pick the same arm: only such a group can tell the two arms apart;
- `kept / sampled`: trajectories the update trained on, of those sampled (the filter's);
- `reward gap`: the mean reward of the better arm's episodes minus the worse arm's, in the
  split groups (what comparing earned, with its noise: the gamble pays 1 or 0).

    python experiments/odds_signal.py --catalog CATALOG --like 'odds-s%' 'nobonus-s%' 'nothink-s%'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import envs
from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script

ROLLOUTS = """
select run, iteration, env, env_options, seed, split, "group", turns[1].actions[1] as action, score, success
from trajectories where ({like}) and split = 'train' order by run, iteration, "group", sample
"""
KEPT = """
select run, iteration, name, value from metrics
where ({like}) and name in ('filter/kept_trajectories', 'filter/groups') order by all
"""


def pct(hits: list[bool]) -> str:
    return f"{100 * sum(hits) / len(hits):.1f}%" if hits else "-"


def blocks(
    groups: dict[tuple[str, int, int], list[dict[str, Any]]], kept: dict[tuple[str, int], dict[str, float]], block: int
) -> list[dict[str, Any]]:
    """A row per run and `block` iterations, from its groups ((run, iteration, group) -> its
    episodes: `action`, `score`, `success`, `gamble_better`) and the filter's metrics."""
    data = []
    for run in sorted({name for name, _, _ in groups}):
        last = max(it for name, it, _ in groups if name == run)
        for start in range(0, last + 1, block):
            span = range(start, min(start + block, last + 1))
            these = [g for (name, it, _), g in groups.items() if name == run and it in span]
            episodes = [r for g in these for r in g]
            split = [g for g in these if len({r["action"] for r in g}) > 1]
            gaps = [
                statistics.mean(r["score"] for r in g if r["success"])
                - statistics.mean(r["score"] for r in g if not r["success"])
                for g in split
                if any(r["success"] for r in g) and not all(r["success"] for r in g)
            ]
            k = sum(kept.get((run, it), {}).get("filter/kept_trajectories", 0) for it in span)
            cells = {
                "episodes": len(episodes),
                "gamble_better": pct([r["success"] for r in episodes if r["gamble_better"]]),
                "gamble_worse": pct([r["success"] for r in episodes if not r["gamble_better"]]),
                "groups_split": pct([len({r["action"] for r in g}) > 1 for g in these]),
                "kept": f"{k:.0f} / {len(episodes)}",
                "reward_gap": f"{statistics.mean(gaps):+.3f}" if gaps else "-",
            }
            data.append({"run": run, "iterations": [span.start, span.stop - 1], **cells})
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--like", required=True, nargs="+", help="runs whose name is LIKE one of these SQL patterns")
    ap.add_argument("--block", type=int, default=5, help="iterations a row")
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    like = " or ".join("run like '{}'".format(p.replace("'", "''")) for p in args.like)
    cat = existing_catalog(args.catalog)
    rows = query(cat, ROLLOUTS.format(like=like)).to_pylist()
    if not rows:
        raise SystemExit(f"no training rollouts of runs like {' or '.join(args.like)}")
    kept: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for m in query(cat, KEPT.format(like=like)).to_pylist():
        kept[(m["run"], m["iteration"])][m["name"]] = m["value"]
    played: dict[str, Any] = {}
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        options = r["env_options"] or "{}"
        env = played.setdefault(f"{r['env']}:{options}", envs.make(r["env"], **json.loads(options)))
        env.reset(r["seed"], r["split"])
        r["gamble_better"] = env.expected(env.high) > env.expected(env.low)
        groups[(r["run"], r["iteration"], r["group"])].append(r)
    out = Recorder()
    out.line(
        "| run | iterations | episodes | better arm, gamble better | gamble worse | groups split | kept / sampled | reward gap |"
    )
    out.line("|---|---|---|---|---|---|---|---|")
    data = blocks(groups, kept, args.block)
    for row in data:
        first, last = row["iterations"]
        cells = [str(v) for k, v in row.items() if k not in ("run", "iterations")]
        out.line(f"| {row['run']} | {first}-{last} | " + " | ".join(cells) + " |")
    if args.save:
        out.save(args.save, data={"rows": data})


if __name__ == "__main__":
    run_script(main)
