"""Off-policy scoring checked against real evals: every later policy version of a run
scored on every earlier version's eval trajectories (`pipeline score`), beside the
later version's real eval on the same seeds.

    python experiments/offpolicy.py --catalog pipeline-data --run starpo

Prints one row per (scored version, evals of version) pair and, over the pairs whose
effective sample size is at least 30, how often the real eval falls inside the
estimate's 95% interval. The real eval is itself a sample (256 episodes at T = 0.5),
so even a perfect estimator covers it less often than 95%.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog
from pipelines.report.scoring import score
from stages.rl.offpolicy import MIN_ESS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None, help="catalog root (default: $PIPELINE_CATALOG or ./pipeline-data)")
    ap.add_argument("--run", required=True)
    ap.add_argument("--boot", type=int, default=1000)
    args = ap.parse_args()
    catalog = Catalog(args.catalog)
    q = args.run.replace("'", "''")
    versions = (
        query(catalog, f"select distinct policy_version v from evals where run = '{q}' and temperature > 0 order by 1")
        .column(0)
        .to_pylist()
    )
    print(f"run {args.run}: eval versions {versions}")
    print(
        "| scored | on evals of | estimate | 95% interval | ESS | real eval | inside |\n|---|---|---|---|---|---|---|"
    )
    inside, trusted = 0, 0
    for i, on in enumerate(versions):
        for v in versions[i + 1 :]:
            s = score(catalog, args.run, v, on, boot=args.boot)
            e, real = s.estimate, s.real[0] if s.real else float("nan")
            hit = e.success_ci[0] <= real <= e.success_ci[1]
            if e.ess >= MIN_ESS:
                trusted += 1
                inside += hit
            print(
                f"| v{v} | v{on} | {e.success:.1%} | [{e.success_ci[0]:.1%}, {e.success_ci[1]:.1%}] | "
                f"{e.ess:.0f} | {real:.1%} | {'yes' if hit else 'no'}{'' if e.ess >= MIN_ESS else ' (ESS < 30)'} |",
                flush=True,
            )
    print(f"real eval inside the interval: {inside} of {trusted} pairs with ESS >= {MIN_ESS:.0f}")


if __name__ == "__main__":
    main()
