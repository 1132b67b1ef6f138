"""What the cluster path costs an iteration on one machine: the README's "On a cluster"
run (StarPO-S with its critic, two engine actors, two Ray Train workers) on a head and
two worker nodes of this machine (`tests/cluster.py`) against the same command in one
process, with the same logical CPUs (4) on the same cores. Prints seconds per iteration
(the mean over iterations after the first, whose engines and workers start) by stage,
and the ratio cluster / one process.

    python bench/cluster.py [--iterations 4] [--save cluster]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog
from common.recording import Recorder
from tests.cluster import LocalCluster

EXE = Path(sys.executable).parent / "pipeline"
#: the README's cluster run, smaller: the suite's small model, 4 groups of 4
SETTINGS = [
    "rollout.actors=2",
    "rollout.actor_cpus=1",
    "eval.actors=2",
    "eval.actor_cpus=1",
    "update.optim.workers=2",
    "model.embedded={hidden_size: 64, layers: 1, heads: 2, kv_heads: 1}",
    "warmstart.episodes=4",
    "warmstart.epochs=1",
    "warmstart.check_episodes=0",
    "rollout.n_groups=4",
    "rollout.group_size=4",
    "eval.episodes=8",
    "update.optim.mini_batch_size=4",
    "critic.optim.mini_batch_size=4",
]


def _run(catalog: Path, iterations: int, address: str | None) -> float:
    args = [a for o in [*SETTINGS, f"run.iterations={iterations}", "pipeline.eval.every=1"] for a in ("-o", o)]
    where = ["--address", address] if address else ["-o", "ray.num_cpus=4"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PIPELINE_CATALOG": ""}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    done = subprocess.run(
        [str(EXE), "run", "starpo-s.yaml", "--catalog", str(catalog), *args, *where],
        env=env,
        capture_output=True,
        text=True,
        cwd=catalog.parent,
    )
    if done.returncode != 0:
        sys.exit(f"error: the run failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - t0


def _per_iteration(catalog: Path) -> dict[str, float]:
    """Mean seconds per iteration after the first: in all, and by stage (a stage that runs
    only some iterations, e.g. `mutual_info` every 10th, is spread over all of them)."""
    rows = query(
        Catalog(str(catalog)),
        "select stage, sum(seconds) / (select count(distinct iteration) from steps where iteration >= 1) s "
        "from steps where iteration >= 1 and status = 'ran' group by stage",
    ).to_pylist()
    out = {r["stage"]: r["s"] for r in rows}
    out["iteration"] = sum(out.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--save", default=None, help="also write what it prints to bench/results/<SAVE>.json")
    args = ap.parse_args()
    out = Recorder()
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
        root = Path(tmp)
        one_wall = _run(root / "one", args.iterations, None)
        nodes = LocalCluster(root / "nodes", workers=2, cpus=2)
        try:
            cluster_wall = _run(root / "cluster", args.iterations, nodes.address)
        finally:
            nodes.close()
        one, cluster = _per_iteration(root / "one"), _per_iteration(root / "cluster")
    out.line(
        f"{args.iterations} iterations; seconds per iteration after the first, 4 logical CPUs on this machine's cores"
    )
    out.line("| | one process | 3-node cluster | cluster / one process |")
    out.line("|---|---|---|---|")
    for stage in ["iteration", *sorted(k for k in one if k != "iteration")]:
        if stage in cluster and one[stage] > 0:
            out.line(f"| {stage} | {one[stage]:.2f} | {cluster[stage]:.2f} | {cluster[stage] / one[stage]:.2f} |")
    out.line(
        f"| whole run (wall, with start-up) | {one_wall:.1f} | {cluster_wall:.1f} | {cluster_wall / one_wall:.2f} |"
    )
    if args.save:
        out.save(args.save, {"one": one, "cluster": cluster, "wall": [one_wall, cluster_wall]})


if __name__ == "__main__":
    main()
