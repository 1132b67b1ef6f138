"""The warm start's spread over run seeds, by lever: for each lever (a set of `-o`
overrides) and each run seed, `pipeline run SPEC --to eval_start` (the embedded model,
the warm start and its eval, nothing else) in one scratch catalog, and one table row of
the warm start's eval success at T = 0.5 and greedily (with the share of its moves into a
hole, on FrozenLake), per seed, with the mean and the lowest seed.

    python experiments/warmstart_seeds.py --levers init-0.02,default       # the default's init against HF's
    python experiments/warmstart_seeds.py --spec starpo-local.yaml --levers default,init-0.05
    python experiments/warmstart_seeds.py --catalog ROOT --table     # the rows again, from the catalog

Where a run ends depends on whether its warm start learned to read the state (README,
"What the default run shows"), so a lever that lifts the lowest seed matters more than
one that lifts the mean. A run of the full spec at the same overrides and seed re-uses
these steps from the catalog. Run one at a time: two runs on 2 cores slow each other.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog

#: lever -> overrides of the spec
LEVERS: dict[str, list[str]] = {
    "default": [],
    "init-0.02": ["model.embedded.init_std=0.02"],  # Hugging Face's initializer_range
    "init-0.05": ["model.embedded.init_std=0.05"],
    "epochs-4": ["warmstart.epochs=4"],
    "epochs-2": ["warmstart.epochs=2"],  # the real-model recipe (starpo-smollm2.yaml) has 3
    "episodes-32": ["warmstart.episodes=32"],
    "lr-4e-5": ["warmstart.lr=4e-5"],  # between 2 and 3 epochs at 5e-5, by lr x steps
    "expert": ["warmstart.random_share=0.0"],
    # an expert with safe noise (the default's warm start is the second; measured on
    # --spec starpo-noisy.yaml, whose 3 epochs the first and third keep)
    "safe-noise-0.8": ["warmstart.noise=random_safe", "warmstart.random_share=0.8"],
    "safe-noise-0.8-epochs-4": ["warmstart.noise=random_safe", "warmstart.random_share=0.8", "warmstart.epochs=4"],
    "safe-noise-0.9": ["warmstart.noise=random_safe", "warmstart.random_share=0.9"],
    "safe-noise-0.5": ["warmstart.noise=random_safe", "warmstart.random_share=0.5"],
    "safe-noise-0.25": ["warmstart.noise=random_safe", "warmstart.random_share=0.25"],
    # the skeptic's cross-check of RL from that warm start: three times the demonstrations,
    # supervised, for about two thirds of the wall time of RL's 20 iterations
    "safe-noise-0.25-episodes-192": [
        "warmstart.noise=random_safe",
        "warmstart.random_share=0.25",
        "warmstart.episodes=192",
    ],
}


def run_name(lever: str, seed: int) -> str:
    return f"ws-{lever}-s{seed}"


def warm_start(catalog: Catalog, run: str) -> dict[float, tuple[float, float | None]]:
    """The warm start's eval success and share of moves into a hole (None where the env has
    no holes), by temperature (0: greedy), in `run`."""
    rows = query(
        catalog,
        "select e.temperature t, avg(e.success::int) s, any_value(b.into_hole) h from evals e "
        "left join eval_behaviour b on b.run = e.run and b.policy_version = e.policy_version "
        f"and b.temperature = e.temperature where e.run = '{run}' and e.policy_version = 0 group by 1",
    ).to_pylist()
    return {r["t"]: (r["s"], r["h"]) for r in rows}


def cell(success: float, hole: float | None) -> str:
    return f"{success:.1%}" + (f" ({hole:.1%} holes)" if hole is not None else "")


def row(lever: str, seeds: list[int], catalog: Catalog, walls: dict[int, float]) -> str:
    cells, sampled = [], []
    for seed in seeds:
        got = warm_start(catalog, run_name(lever, seed))
        hot = next((v for t, v in got.items() if t > 0), None)
        greedy = got.get(0.0)
        if hot is None:
            cells.append("not run")
            continue
        sampled.append(hot[0])
        wall = f", {walls[seed]:.0f} s" if seed in walls else ""
        cells.append(f"{cell(*hot)} / {cell(*greedy)}{wall}" if greedy is not None else f"{cell(*hot)}{wall}")
    summary = f"{statistics.mean(sampled):.1%} | {min(sampled):.1%}" if sampled else "- | -"
    return f"| {lever} | {' '.join(LEVERS[lever]) or '-'} | {' | '.join(cells)} | {summary} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="starpo-relative.yaml")
    ap.add_argument("--levers", default="init-0.02,default")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--catalog", default=None, help="scratch catalog (default: a new temporary folder)")
    ap.add_argument("--table", action="store_true", help="only print the rows of runs already in --catalog")
    args = ap.parse_args()
    root = args.catalog or tempfile.mkdtemp(prefix="warmstarts-")
    seeds = [int(s) for s in args.seeds.split(",")]
    levers = args.levers.split(",")
    unknown = [lever for lever in levers if lever not in LEVERS]
    if unknown:
        sys.exit(f"error: --levers: unknown {', '.join(unknown)} (known: {', '.join(LEVERS)})")
    print(f"{args.spec}: the warm start's eval success, T = 0.5 / greedy, by run seed; catalog {root}")
    head = " | ".join(f"seed {s}" for s in seeds)
    print(f"| lever | overrides | {head} | mean (T = 0.5) | lowest |\n|{'---|' * (len(seeds) + 4)}")
    for lever in levers:
        walls: dict[int, float] = {}
        for seed in seeds if not args.table else []:
            overrides = [f"run.name={run_name(lever, seed)}", f"run.seed={seed}", *LEVERS[lever]]
            cmd = ["pipeline", "run", args.spec, "--to", "eval_start", "--catalog", root]
            start = time.monotonic()
            done = subprocess.run(cmd + [x for o in overrides for x in ("-o", o)], capture_output=True, text=True)
            walls[seed] = time.monotonic() - start
            if done.returncode:
                print(f"| {lever} | seed {seed} failed: {done.stderr.strip().splitlines()[-1:]} |", flush=True)
        print(row(lever, seeds, Catalog(root), walls), flush=True)


if __name__ == "__main__":
    main()
