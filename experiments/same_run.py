"""Two runs that should be one: do they sample the same tokens and evaluate the same?

For each policy version both runs evaluated, the eval success of each (at `--temperature`),
and over all their rollouts the share of episodes (matched by iteration, group and sample)
whose token ids, loss mask and score are equal. The OpenEnv preset uses it: the default
trained through openenv-core's server against the default in process.

    python experiments/same_run.py --catalog CATALOG starpo-openenv-frozenlake starpo --save openenv-frozenlake
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script


def _q(text: str) -> str:
    return text.replace("'", "''")


def evals(catalog: Any, run: str, temperature: float) -> dict[int, tuple[float, int]]:
    rows = query(
        catalog,
        f"select policy_version v, avg(success::int) s, count(*)::bigint n from evals where run = '{_q(run)}' "
        f"and temperature = {float(temperature)} group by 1 order by 1",
    ).to_pylist()
    return {r["v"]: (r["s"], r["n"]) for r in rows}


def episodes(catalog: Any, run: str) -> dict[tuple[int, int, int], tuple[Any, ...]]:
    rows = query(
        catalog,
        f"select iteration, \"group\", sample, token_ids, loss_mask, score from trajectories where run = '{_q(run)}'",
    ).to_pylist()
    return {(r["iteration"], r["group"], r["sample"]): (r["token_ids"], r["loss_mask"], r["score"]) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    catalog = existing_catalog(args.catalog)
    a, b = evals(catalog, args.run_a, args.temperature), evals(catalog, args.run_b, args.temperature)
    both = sorted(set(a) & set(b))
    if not both:
        raise SystemExit(f"no policy version evaluated by both {args.run_a} and {args.run_b} at T={args.temperature:g}")
    out = Recorder()
    out.line(f"| version | {args.run_a} | {args.run_b} | episodes each |")
    out.line("|---|---|---|---|")
    for v in both:
        out.line(f"| {v} | {100 * a[v][0]:.1f}% | {100 * b[v][0]:.1f}% | {a[v][1]} |")
    ea, eb = episodes(catalog, args.run_a), episodes(catalog, args.run_b)
    shared = set(ea) & set(eb)
    same = sum(ea[k] == eb[k] for k in shared)
    out.line("")
    out.line(
        f"rollout episodes: {len(ea)} and {len(eb)}; of the {len(shared)} in both, {same} sampled the same tokens "
        f"with the same mask and score ({100 * same / max(1, len(shared)):.1f}%)"
    )
    if args.save:
        out.save(
            args.save,
            data={
                "evals": {str(v): {"a": a[v][0], "b": b[v][0], "episodes": a[v][1]} for v in both},
                "episodes": {"a": len(ea), "b": len(eb), "shared": len(shared), "same": same},
            },
        )


if __name__ == "__main__":
    run_script(main)
