"""Asynchronous StarPO on this machine: the default at staleness 0 (step by step, both
cores), and at staleness k >= 1, where iteration i's rollout samples with the policy
k updates back (``policy@prev:k+1``), steps run at once (``run.concurrency: 2``), the
update corrects with the decoupled objective, and the engine actor and the update get
one core each (``OMP_NUM_THREADS=1``; Ray gives a 1-CPU actor one thread).

    python bench/async.py                       # staleness 0 and 1, 60 iterations each
    python bench/async.py --staleness 0,1,2 --iterations 30 --catalog /tmp/async

All variants share one scratch catalog, so the once-stages (model, warm start, its
eval) are computed once, by the first. For each: iterations per minute (from the start
of iteration 1, whose rollout is the first that differs between variants, to the last
step's end, evals included), the seconds in which
two steps ran at once, and eval success at each eval. Run it alone: other jobs on 2
cores distort every number.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog


def overrides(k: int, iterations: int, every: int) -> list[str]:
    base = [f"run.name=async-s{k}", f"run.iterations={iterations}", f"pipeline.eval.every={every}"]
    if k == 0:
        return base
    return [
        *base,
        "run.concurrency=2",
        f"pipeline.rollout.inputs={{policy: policy@prev:{k + 1}}}",
        f"pipeline.mutual_info.inputs={{policy: policy@prev:{k + 1}}}",
        "update.correction=decoupled",
    ]


def measure(catalog: Catalog, run: str) -> tuple[float, float, str]:
    """(iterations per minute, seconds with two steps at once, eval curve) of a finished run."""
    steps = query(
        catalog,
        f"""select iteration, epoch(finished_at) - seconds t0, epoch(finished_at) t1 from steps
        where run = '{run}' and iteration >= 1 and status = 'ran' order by t0""",
    ).to_pylist()
    span = max(s["t1"] for s in steps) - min(s["t0"] for s in steps)
    iterations = len({s["iteration"] for s in steps})
    edges = sorted([(s["t0"], 1) for s in steps] + [(s["t1"], -1) for s in steps])
    overlap, depth, last = 0.0, 0, 0.0
    for t, d in edges:
        if depth >= 2:
            overlap += t - last
        depth, last = depth + d, t
    curve = query(
        catalog,
        f"""select policy_version v, avg(success::int) s from evals
        where run = '{run}' and temperature > 0 group by 1 order by 1""",
    ).to_pylist()
    return 60 * iterations / span, overlap, " ".join(f"v{r['v']}:{r['s']:.1%}" for r in curve)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="starpo-relative.yaml")
    ap.add_argument("--staleness", default="0,1")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--catalog", default=None, help="scratch catalog (default: a new temporary folder)")
    ap.add_argument("--table", action="store_true", help="only print the rows of runs already in --catalog")
    args = ap.parse_args()
    root = args.catalog or tempfile.mkdtemp(prefix="async-")
    print(f"{args.spec}, {args.iterations} iterations, catalog {root}")
    print(
        "| staleness | iterations / min | vs staleness 0 | s with 2 steps at once | eval success |\n|---|---|---|---|---|"
    )
    base = None
    for k in (int(x) for x in args.staleness.split(",")):
        if not args.table:
            env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if k else {})}
            cmd = ["pipeline", "run", args.spec, "--catalog", root]
            cmd += [x for o in overrides(k, args.iterations, args.every) for x in ("-o", o)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"| {k} | failed: {done.stderr.strip().splitlines()[-1:]} |")
                continue
        rate, overlap, curve = measure(Catalog(root), f"async-s{k}")
        base = base or rate
        print(f"| {k} | {rate:.2f} | {rate / base:.2f}x | {overlap:.0f} | {curve} |", flush=True)


if __name__ == "__main__":
    main()
