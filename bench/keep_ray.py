"""Runs in one process with the local Ray session kept (``PIPELINE_KEEP_RAY=1``) against
each run starting and stopping its own: wall seconds and the machine's busy CPU-seconds.

``--runs`` small runs of the relative-view preset (`configs/starpo-relative.yaml`, one
iteration, the engine actor and Ray Data of the default; a tiny model, 2 x 2 groups, 2
eval episodes), each with its own seed so that nothing is cached, one after the other in
one Python process, as a notebook or a script looping over settings runs them. Each mode
runs in a fresh process; the CPU is read from /proc/stat, so the machine must be quiet.

    python bench/keep_ray.py [--runs 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _runs(n: int, folder: Path) -> None:
    """`n` runs in this process (the child's side)."""
    from catalog.store import Catalog
    from pipelines.graph.load import load_spec
    from pipelines.run.progress import Quiet
    from pipelines.run.runner import Runner
    from tests.conftest import SMALL_RELATIVE  # the suite's small settings (tests/__init__: one torch thread)

    for seed in range(n):
        spec = load_spec(
            str(ROOT / "configs" / "starpo-relative.yaml"), (*SMALL_RELATIVE, "run.iterations=1", f"run.seed={seed}")
        )
        Runner(spec, Catalog(str(folder / f"catalog{seed}")), Quiet()).run()


def _busy() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _measure(keep: bool, runs: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PIPELINE_KEEP_RAY": "1" if keep else "0"}
        busy, t0 = _busy(), time.monotonic()
        subprocess.run([sys.executable, __file__, "--child", str(runs), folder], env=env, check=True)
        return time.monotonic() - t0, _busy() - busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _runs(int(args.child[0]), Path(args.child[1]))
        return
    off = _measure(False, args.runs)
    on = _measure(True, args.runs)
    print(f"{args.runs} runs in one process (starpo-relative, small, one iteration, one engine actor)")
    print(f"{'':24}{'wall s':>10}{'busy CPU-s':>12}")
    print(f"{'a session per run':24}{off[0]:10.1f}{off[1]:12.1f}")
    print(f"{'one session kept':24}{on[0]:10.1f}{on[1]:12.1f}")
    print(f"kept / per run: wall {on[0] / off[0]:.2f}, CPU {on[1] / off[1]:.2f}")


if __name__ == "__main__":
    main()
