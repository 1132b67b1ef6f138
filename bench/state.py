"""What the run's state model costs an iteration: the same spec run twice into one
catalog (its warm start computed once), with the policy reloaded and stored at every
update (``update.resident=false``: every update a new Ray Train fit from the stored
policy, every version stored whole, as the run did before the resident trainer) and
with the default (the policy kept in the run's trainer, stored every
``update.checkpoint_every`` versions and where a stage reads it from storage, weights to
the engines from memory). Prints the bytes each iteration wrote to the catalog, seconds
per iteration after the first, and the share of the update spent loading and storing
state, with the ratios new / before.

    python bench/state.py [--spec starpo-smollm2] [--iterations 4] [--catalog ROOT] [--save state-smollm2]
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

EXE = Path(sys.executable).parent / "pipeline"


def _run(catalog: Path, spec: str, name: str, overrides: list[str]) -> float:
    args = [a for o in [f"run.name={name}", *overrides] for a in ("-o", o)]
    env = {**os.environ, "PIPELINE_CATALOG": ""}
    t0 = time.monotonic()
    done = subprocess.run(
        [str(EXE), "run", spec, "--catalog", str(catalog), *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"error: the run {name} failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - t0


def _measure(catalog: Catalog, run: str) -> dict[str, float]:
    """Per iteration after the first: seconds (every step that ran), bytes committed (every
    result the run made in its iterations), and the update's seconds and its state part."""
    steps = f"select * from steps where run = '{run}' and iteration >= 1 and status = 'ran'"
    rows = query(
        catalog,
        f"select count(distinct s.iteration) as n, sum(s.seconds) as seconds, sum(r.bytes) as bytes, "
        f"sum(case when s.stage = 'update' then s.seconds else 0 end) as update_s "
        f"from ({steps}) s join results r on r.key = s.key",
    ).to_pylist()[0]
    state = query(
        catalog,
        f"select coalesce(sum(m.value), 0) as v from ({steps}) s join metrics m on m.key = s.key "
        "where m.name = 'perf/state_seconds'",
    ).to_pylist()[0]["v"]
    n = rows["n"] or 1
    return {
        "seconds": float(rows["seconds"]) / n,
        "bytes": float(rows["bytes"]) / n,
        "update": float(rows["update_s"]) / n,
        "state": float(state) / n,
    }


def _load_and_store_seconds(catalog: Catalog, run: str) -> float:
    """What reloading and storing the policy costs where the trainer does not live for
    the run: the last stored update's checkpoint loaded with its optimiser state and
    written again (the update's Ray Train fit does both, every iteration)."""
    import torch

    from stages.models.policy import load_policy, save_policy
    from stages.training.fit import OPTIMIZER_FILE, OptimConfig, optimizer

    key = query(
        catalog,
        f"select s.key from steps s where s.run = '{run}' and s.stage = 'update' order by s.iteration desc limit 1",
    ).to_pylist()[0]["key"]
    path = catalog.ref(key, "policy").local_path()
    with tempfile.TemporaryDirectory(prefix="state-bench-") as tmp:
        t0 = time.perf_counter()
        model, tokenizer = load_policy(path, dtype="float32")
        opt = optimizer(model, OptimConfig(), path)
        save_policy(model, tokenizer, Path(tmp), version=0)
        torch.save(opt.state_dict(), Path(tmp) / OPTIMIZER_FILE)
        return float(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="starpo-smollm2")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=16)
    ap.add_argument(
        "--catalog", default=None, help="a catalog to run in (its warm start is re-used); default: a new one"
    )
    ap.add_argument(
        "--measured",
        type=float,
        nargs=2,
        default=None,
        metavar=("BEFORE_WALL", "NOW_WALL"),
        help="print the runs already in --catalog (their whole-run walls in seconds, as printed) without running",
    )
    ap.add_argument("--save", default=None, help="also write what it prints to bench/results/<SAVE>.json")
    args = ap.parse_args()
    out = Recorder()
    # eval only on the warm start and after the last, on a few lakes: what is measured is the iterations
    common = [f"run.iterations={args.iterations}", "pipeline.eval.every=1000", f"eval.episodes={args.eval_episodes}"]
    with tempfile.TemporaryDirectory(prefix="state-bench-") as tmp:
        root = Path(args.catalog) if args.catalog else Path(tmp) / "catalog"
        tag = f"{Path(args.spec).stem}-{args.iterations}"
        if args.measured is None:
            _run(root, args.spec, f"state-start-{tag}", [*common, "run.iterations=1"])  # the warm start, shared
            before_wall = _run(root, args.spec, f"state-before-{tag}", [*common, "update.resident=false"])
            now_wall = _run(root, args.spec, f"state-now-{tag}", common)
        else:  # the runs are in --catalog already: their walls as measured then
            before_wall, now_wall = args.measured
        catalog = Catalog(str(root))
        before, now = _measure(catalog, f"state-before-{tag}"), _measure(catalog, f"state-now-{tag}")
        before["state"] = _load_and_store_seconds(catalog, f"state-before-{tag}")
    out.line(f"`{args.spec}`, {args.iterations} iterations; per iteration after the first (eval only after the last)")
    out.line("| | every update a new fit, every version stored | resident trainer (default) | new / before |")
    out.line("|---|---|---|---|")
    out.line(
        f"| bytes written to the catalog | {before['bytes'] / 2**20:,.1f} MiB | {now['bytes'] / 2**20:,.3f} MiB | "
        f"{now['bytes'] / before['bytes']:.4f} |"
    )
    out.line(f"| seconds | {before['seconds']:.1f} | {now['seconds']:.1f} | {now['seconds'] / before['seconds']:.2f} |")
    out.line(
        f"| update seconds | {before['update']:.1f} | {now['update']:.1f} | {now['update'] / before['update']:.2f} |"
    )
    out.line(
        f"| loading and storing state (share of the iteration) | {before['state']:.1f} s "
        f"({before['state'] / before['seconds']:.0%}) | {now['state']:.2f} s ({now['state'] / now['seconds']:.0%}) | "
        f"{now['state'] / before['state']:.3f} |"
    )
    out.line(
        f"| whole run (wall: start-up, iteration 0 and the final eval) | {before_wall:.0f} s | {now_wall:.0f} s | "
        f"{now_wall / before_wall:.2f} |"
    )
    if args.save:
        out.save(args.save, {"before": before, "now": now, "wall": [before_wall, now_wall]})


if __name__ == "__main__":
    main()
