"""The held-out odds curve: does a trained bandit policy pick the better arm by comparing
the two stated expectations, at odds and payoffs it never trained on?

For each run, its last policy version plays the held-out pair (Trader / Librarian, names
never trained on) with the payoffs stated, at a grid of odds on both sides of the sure arm
(0.1 every time): the gamble paying 1 with probability 0.05 ... 0.5, and paying 2 or 0.5.
Each cell is `--episodes` validation seeds at the eval's temperature, through the run's
own agent loop (the preset's `eval.agent`). Every turn's thought is checked by the
environment's rule (`envs.bandit.judge`): `right` (it states both arms' expectations, right),
`follows` (the answer is the arm it says pays more) and `success` (the better arm).

Beside each cell, the rules a policy could have learned instead: "answer the gamble"
(right exactly where the gamble is the better arm) and "compare" (right everywhere).
The goal (issue: reasoning that compares): the better arm on at least 90% of turns
wherever the gap between the two expectations is at least 0.05, on both sides, at every seed.

    python experiments/odds_curve.py --catalog CATALOG --runs odds-s0 odds-s1 odds-s2 --save smollm2-bandit-odds-curve
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

import envs
from catalog.datasets import ArtifactRef
from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script
from envs.bandit import arms_of
from envs.bandit import judge as rule
from pipelines.graph.load import load_spec
from pipelines.report.scoring import policy_key
from stages.agent.play import PlayJob, episode_specs, play_batch, validation_seeds
from stages.engines.hf import HFEngine

#: (the gamble's payoff, its probability of paying): the sure arm pays 0.1
GRID: tuple[tuple[float, float], ...] = (
    *((1.0, p) for p in (0.05, 0.08, 0.12, 0.2, 0.3, 0.5)),
    *((2.0, p) for p in (0.02, 0.04, 0.1, 0.2)),
    *((0.5, p) for p in (0.1, 0.3, 0.5, 0.8)),
)
SURE = 0.1
#: the gap (|gamble's expectation - the sure arm's|) from which the goal asks for 90%
GAP = 0.05
GOAL = 0.9


def last_version(catalog: Any, run: str) -> int:
    rows = query(catalog, f"select max(policy_version) v from evals where run = '{run.replace(chr(39), '')}'")
    version = rows.to_pylist()[0]["v"]
    if version is None:
        raise SystemExit(f"run '{run}' has no evals in the catalog")
    return int(version)


def cell(engine: Any, job: PlayJob, payoff: float, p: float, episodes: int) -> dict[str, Any]:
    """One grid cell played and judged: shares of right thoughts, answers that follow, successes."""
    options = {"payoffs": True, "high_p": p, "high_reward": payoff}
    specs = episode_specs("bandit_heldout", options, validation_seeds(episodes), 1, "validation")
    table = play_batch(engine, pa.Table.from_pylist([asdict(s) for s in specs]), job)
    env = envs.make("bandit_heldout", **options)
    right = follows = success = judged = 0
    for row in table.to_pylist():
        env.reset(row["seed"], "validation")
        expected = {arm: env.expected(arm) for arm in env.order}
        turn = row["turns"][0]
        arms = arms_of(turn["state"])
        said = rule(arms, turn["think"], (turn["actions"] or [None])[0], expected) if arms else None
        right += bool(said and said.right)
        follows += bool(said and said.follows)
        judged += bool(said and said.states)
        success += bool(row["success"])
    n = table.num_rows
    gap = payoff * p - SURE
    return {
        "payoff": payoff,
        "p": p,
        "gap": round(gap, 4),
        "episodes": n,
        "right": right / n,
        "follows": follows / judged if judged else None,
        "success": success / n,
        "gamble_rule": 1.0 if gap >= 0 else 0.0,
    }


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--spec", default="starpo-smollm2-bandit-odds.yaml", help="the preset (its eval's agent loop)")
    ap.add_argument("--episodes", type=int, default=64, help="validation seeds a cell")
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    catalog = existing_catalog(args.catalog)
    (node,) = [n for n in load_spec(args.spec).nodes if n.name == "eval"]
    cfg = node.config
    out = Recorder()
    data: list[dict[str, Any]] = []
    for run in args.runs:
        version = last_version(catalog, run)
        ref = catalog.ref(policy_key(catalog, run, version), "policy")
        assert isinstance(ref, ArtifactRef)
        engine = HFEngine(ref.local_path())
        job = PlayJob(cfg.agent, cfg.agent.sampling(cfg.temperature, 1.0, 0), 0, cfg.max_batch or 0)
        started = time.time()
        rows = [cell(engine, job, payoff, p, args.episodes) for payoff, p in GRID]
        met = all(r["success"] >= GOAL for r in rows if abs(r["gap"]) >= GAP - 1e-9)
        data.append({"run": run, "version": version, "cells": rows, "goal_met": met, "wall_s": time.time() - started})
    runs = " | ".join(f"{d['run']} v{d['version']}: success, follows" for d in data)
    out.line(f"T = {cfg.temperature:g}, {args.episodes} held-out seeds a cell; the sure arm pays {SURE:g}")
    out.line("")
    out.line(f"| gamble pays | with p | gap | thought right | {runs} | answer the gamble |")
    out.line("|---|---|---|---|" + "---|" * len(data) + "---|")
    for k, (payoff, p) in enumerate(GRID):
        cells = [d["cells"][k] for d in data]
        right = statistics.fmean(c["right"] for c in cells)
        shown = " | ".join(f"{pct(c['success'])}, {pct(c['follows'])}" for c in cells)
        gap = cells[0]["gap"]
        out.line(f"| {payoff:g} | {p:g} | {gap:+.2f} | {pct(right)} | {shown} | {pct(cells[0]['gamble_rule'])} |")
    out.line("")
    for d in data:
        out.line(
            f"{d['run']}: the better arm on >= {GOAL:.0%} wherever |gap| >= {GAP}: {'yes' if d['goal_met'] else 'no'}"
        )
    if args.save:
        out.save(args.save, data={"runs": data, "temperature": cfg.temperature, "episodes": args.episodes})


if __name__ == "__main__":
    run_script(main)
