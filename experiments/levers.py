"""RL levers on the default setting: each lever is `pipeline run` of a spec with some
`-o` overrides, in one scratch catalog (so runs that share the warm start compute it
once), and one row of a table: the eval success of the warm-started policy, at every
eval, and the gain.

    python experiments/levers.py                                   # every lever in LEVERS, 30 iterations each
    python experiments/levers.py --levers default,vanilla --iterations 60
    python experiments/levers.py --spec envs/sokoban.yaml --levers default
    python experiments/levers.py --levers default,explore-0.1 --set run.seed=1   # every lever at run seed 1
    python experiments/levers.py --levers temperature-0.7 --iterations 90 --set run.seed=2 --tag=-s2 \
        --catalog C     # a lever of the default at its length, seed 2 (run lever-temperature-0.7-s2)

A lever's wall time is its run's (a cached warm start costs nothing); `--table`
prints the rows again from the catalog without running anything. Run one at a time:
two runs on 2 cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog

LAKE = "{slippery: false, render: %s}"

#: lever -> overrides of the spec (see the module docstring)
LEVERS: dict[str, list[str]] = {
    "default": [],
    "vanilla": [
        "filter.strategy=none",
        "filter.drop_zero_std=false",
        "update.clip_ratio_high=0.2",
        "update.kl_coef=0.001",
    ],
    "keep-zero-std": ["filter.drop_zero_std=false"],
    "no-filter": ["filter.strategy=none", "filter.drop_zero_std=false"],
    "gigpo": ["advantage.estimator=gigpo"],
    "lr-1e-4": ["update.optim.lr=1.0e-4"],
    "lr-3e-4": ["update.optim.lr=3.0e-4"],
    "lr-5e-4": ["update.optim.lr=5.0e-4"],
    "temperature-0.7": ["rollout.temperature=0.7"],
    "entropy-0.01": ["update.entropy_coef=0.01"],
    "kl-0.1": ["update.kl_coef=0.1"],
    "online-2": ["rollout.online_k=2"],
    "online-2-no-filter": ["rollout.online_k=2", "filter.strategy=none", "filter.drop_zero_std=false"],
    "online-2-adaptive": ["rollout.online_k=2", "filter.strategy=adaptive", "filter.ratio=0.9"],
    "groups-32x4": ["rollout.n_groups=32", "rollout.group_size=4"],
    "groups-8x16": ["rollout.n_groups=8", "rollout.group_size=16"],
    "history-full": [f"{k}.agent.history=null" for k in ("warmstart", "rollout", "eval")],
    # the last turn in each prompt: a memoryless greedy policy walks between two cells (README)
    "history-1": [f"{k}.agent.history=1" for k in ("warmstart", "rollout", "eval")],
    "format-only-warmstart": [
        "warmstart.demonstrator=random_valid",
        "warmstart.random_share=0.0",
        "warmstart.action_loss=0.0",
        "warmstart.episodes=256",
        "warmstart.epochs=1",
    ],
    "expert-warmstart": ["warmstart.random_share=0.0"],
    # warm starts that read the hole labels: a safe random walker; the noisy expert with safe noise
    "safe-walker-warmstart": ["warmstart.demonstrator=random_safe", "warmstart.random_share=0.0"],
    "safe-noise-warmstart": ["warmstart.noise=random_safe"],
    "safe-noise-0.8-warmstart": ["warmstart.noise=random_safe", "warmstart.random_share=0.8"],
    # the same with each response ending at its `</answer>`, as the default's do: nothing after the answer
    # is sampled and trained on (on Sokoban, without it, answers ran on or lost their closing tag: README)
    "safe-noise-0.8-stop": ["warmstart.noise=random_safe", "warmstart.random_share=0.8", "agent.stop_at_answer=true"],
    "render-grid": [
        "warmstart.env_options.frozenlake.render=grid",
        "rollout.env_options.render=grid",
        "eval.env_options.frozenlake.render=grid",
    ],
    "render-relative": [
        "warmstart.env_options.frozenlake.render=relative",
        "rollout.env_options.render=relative",
        "eval.env_options.frozenlake.render=relative",
    ],
    "relative-gigpo": [
        "warmstart.env_options.frozenlake.render=relative",
        "rollout.env_options.render=relative",
        "eval.env_options.frozenlake.render=relative",
        "advantage.estimator=gigpo",
    ],
    # exploration where the policy is sure (docs/method.md#exploration-where-the-policy-is-sure)
    "explore-0.1": ["rollout.explore=0.1"],
    "explore-0.3": ["rollout.explore=0.3"],
    "explore-0.1-all": ["rollout.explore=0.1", "advantage.explored=all"],
    "render-positions": [
        "warmstart.env_options.frozenlake.render=positions",
        "rollout.env_options.render=positions",
        "eval.env_options.frozenlake.render=positions",
    ],
}


def evals(catalog: Catalog, run: str) -> list[tuple[int, float]]:
    """Eval success (at the eval temperature) by policy version; version 0 is the warm
    start (its eval is the run's even when the run took it from the cache)."""
    rows = query(
        catalog,
        f"""select policy_version v, avg(success::int) s from evals
        where temperature > 0 and run = '{run}' group by 1 order by 1""",
    ).to_pylist()
    return [(r["v"], r["s"]) for r in rows]


def run_lever(name: str, args: argparse.Namespace, root: str) -> str:
    overrides = [
        f"run.name=lever-{name}{args.tag}",
        f"run.iterations={args.iterations}",
        f"pipeline.eval.every={args.every}",
        *args.set,
        *LEVERS[name],
    ]
    cmd = ["pipeline", "run", args.spec, "--catalog", root] + [x for o in overrides for x in ("-o", o)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return f"| {name} | {' '.join(LEVERS[name])} | failed: {done.stderr.strip().splitlines()[-1:]} |"
    return row(name, Catalog(root), args.tag)


def row(name: str, catalog: Catalog, tag: str = "") -> str:
    """The table row of a lever's finished run."""
    run = query(
        catalog,
        f"select epoch(finished_at) - epoch(started_at) s from runs where run = 'lever-{name}{tag}' and status = 'finished'",
    ).to_pylist()
    if not run:
        return f"| {name} | {' '.join(LEVERS[name])} | not run |"
    wall = run[0]["s"]
    curve = evals(catalog, f"lever-{name}{tag}")
    first, last = curve[0][1], curve[-1][1]
    best = max(s for _, s in curve[1:]) if len(curve) > 1 else last
    points = " ".join(f"v{v}:{s:.1%}" for v, s in curve)
    return (
        f"| {name} | {' '.join(LEVERS[name]) or '-'} | {points} | {100 * (last - first):+.1f} | "
        f"{100 * (best - first):+.1f} | {wall:.0f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="starpo-relative.yaml")
    ap.add_argument("--levers", default=",".join(LEVERS))
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], help="an override of every lever's run, e.g. run.seed=1")
    ap.add_argument(
        "--tag", default="", help="appended to each lever's run name, e.g. --tag=-s2 beside --set run.seed=2"
    )
    ap.add_argument("--catalog", default=None, help="scratch catalog (default: a new temporary folder)")
    ap.add_argument("--table", action="store_true", help="only print the rows of levers already run in --catalog")
    args = ap.parse_args()
    root = args.catalog or tempfile.mkdtemp(prefix="levers-")
    print(f"{args.spec}, {args.iterations} iterations, catalog {root}")
    print(
        "| lever | overrides | eval success by policy version | last - warm start (points) | "
        "best - warm start | wall s |\n|---|---|---|---|---|---|"
    )
    for name in args.levers.split(","):
        print(row(name, Catalog(root), args.tag) if args.table else run_lever(name, args, root), flush=True)


if __name__ == "__main__":
    main()
