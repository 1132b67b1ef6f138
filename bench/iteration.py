"""Where one default iteration's time goes: model compute against everything else.

Runs `configs/starpo-relative.yaml` (the relative-view preset: no pretraining to wait for; or ``--spec``; warm start cached beforehand, not timed; eval nodes
left out: they run every 10 iterations) for two iterations and breaks down the
second, the one every later iteration repeats (the first also starts Ray, the
engine actor and its engine: shown on its own line). Model compute is the
engine's generate (reported by the engine host, `perf/generate_seconds`), the
update's forward/backward passes and optimiser steps, and the critic's forward
pass where there is a critic. The rest is timed where it happens: Ray Data and
actor calls, the agent loop and environments, checkpoint load and save, Ray
Train's start and finish, Parquet reads, Arrow <-> tensor conversion, the commit
of each result; what no timer covers is "other (Python, metrics, planning)".

Then the same iteration at 4x and 16x the trajectories (``rollout.n_groups``):
the wall should grow linearly; the ratio to linear says where it does not.
Peak memory is sampled (PSS) over the driver and every process it started (Ray's
included), and for the driver alone (RSS).

    python bench/iteration.py [--scales 1,4,16] [--spec starpo-relative.yaml] [--catalog DIR] [-o KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import stages.models.batching
import stages.models.critic
import stages.models.forward
import stages.models.policy
import stages.rollout
import stages.training.fit
import stages.training.loops
from catalog.datasets import TableRef
from catalog.store import Catalog, ResultWriter
from pipelines.graph.load import load_spec
from pipelines.run import runner as runner_module
from pipelines.run.hooks import StepEvent
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner

SECONDS: dict[str, float] = defaultdict(float)
_DEPTH: dict[str, int] = defaultdict(int)
COMPUTE = ("generate", "forward/backward", "optimiser step", "critic forward", "critic forward/backward")


def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding its wall time to SECONDS[label] (outermost call only)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _DEPTH[label] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[label] -= 1
            if _DEPTH[label] == 0:
                SECONDS[label] += time.perf_counter() - t0

    return wrapper


def instrument() -> None:
    """Wrap the functions an iteration spends its time in (this process: the
    driver, which also runs Ray Train's local-mode loop)."""
    from stages.engines.hf import HFEngine

    HFEngine.generate = timed("generate (driver)", HFEngine.generate)  # type: ignore[method-assign]
    stages.training.loops._actor_micro_batch = timed("forward/backward", stages.training.loops._actor_micro_batch)
    stages.training.fit.step = timed("optimiser step", stages.training.fit.step)
    import torch

    in_critic = [False]  # the critic update's forward and backward passes, apart from the advantage's forward
    critic_values, advantage_values = (
        timed("critic forward/backward", stages.models.forward.values),
        timed("critic forward", stages.models.forward.values),
    )
    stages.models.forward.values = lambda *a, **k: (critic_values if in_critic[0] else advantage_values)(*a, **k)
    critic_backward = timed("critic forward/backward", torch.autograd.backward)
    plain_backward = torch.autograd.backward
    torch.autograd.backward = lambda *a, **k: (critic_backward if in_critic[0] else plain_backward)(*a, **k)
    loop = stages.training.loops.critic_loop

    def critic_loop(config: dict[str, Any]) -> None:
        in_critic[0] = True
        try:
            loop(config)
        finally:
            in_critic[0] = False

    stages.training.loops.critic_loop = critic_loop
    stages.models.policy.load_policy = timed("checkpoint load", stages.models.policy.load_policy)
    stages.models.critic.load_critic = timed("checkpoint load", stages.models.critic.load_critic)
    stages.training.fit.optimizer = timed("checkpoint load", stages.training.fit.optimizer)
    stages.training.fit.report = timed("checkpoint save", stages.training.fit.report)
    stages.training.loops.actor_loop = timed("in the training loop", stages.training.loops.actor_loop)
    stages.training.loops.critic_loop = timed("in the training loop", stages.training.loops.critic_loop)
    stages.training.fit.fit = timed("Ray Train fit", stages.training.fit.fit)
    for module in (stages.models.batching, stages.training.fit):  # fit holds its own references
        for name in ("padded", "unpadded", "per_sample"):
            if hasattr(module, name):
                setattr(module, name, timed("Arrow <-> tensors", getattr(module, name)))
    stages.rollout.trajectory_metrics = timed("rollout metrics", stages.rollout.trajectory_metrics)
    stages.rollout.collapse_metrics = timed("rollout metrics", stages.rollout.collapse_metrics)
    TableRef.read = timed("Parquet read", TableRef.read)  # type: ignore[method-assign]
    ResultWriter.commit = timed("commit (Parquet write, manifest)", ResultWriter.commit)  # type: ignore[method-assign]
    runner_module._Ray.__call__ = timed("Ray start", runner_module._Ray.__call__)  # type: ignore[method-assign]


def _tree_memory(root: int) -> tuple[int, int]:
    """(RSS of `root`, PSS of `root` and all its descendants) in bytes, from /proc.
    PSS splits each shared page among the processes mapping it (Ray's object store
    is shared memory), so the sum does not count a page twice."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier and p not in tree]
        tree.update(frontier)

    def field(pid: int, name: str, file: str) -> int:
        try:
            for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    return field(root, "VmRSS", "status"), sum(field(p, "Pss", "smaps_rollup") for p in tree)


class PeakRSS:
    """Samples the resident memory of this process and of everything it started (Linux)."""

    def __init__(self) -> None:
        self.tree = self.driver = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            driver, tree = _tree_memory(os.getpid())
            self.driver, self.tree = max(self.driver, driver), max(self.tree, tree)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_iterations(catalog: Catalog, spec: str, overrides: list[str]) -> tuple[list[StepEvent], dict[str, float]]:
    """Two iterations; (their steps, SECONDS spent in the second iteration)."""
    display = Quiet()
    snapshot: dict[str, float] = {}

    def on_iteration(i: int, metrics: dict[str, float]) -> None:
        if i == 0:
            snapshot.update(SECONDS)

    SECONDS.clear()
    Runner(load_spec(spec, ["run.iterations=2", *overrides]), catalog, display).run(on_iteration)
    return display.events, {k: v - snapshot.get(k, 0.0) for k, v in SECONDS.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", default="1,4,16", help="multiples of the default trajectories per iteration")
    parser.add_argument("--catalog", default=None, help="catalog to keep the warm start in (default: a temp dir)")
    parser.add_argument(
        "--spec",
        default="starpo-relative.yaml",
        help="the spec whose iteration is measured (e.g. starpo-s.yaml: with a critic and GAE)",
    )
    parser.add_argument("-o", dest="overrides", action="append", default=[], help="spec override (repeatable)")
    args = parser.parse_args()
    catalog = Catalog(args.catalog or tempfile.mkdtemp(prefix="bench-iteration-"))
    spec = str(Path(tempfile.mkdtemp(prefix="bench-iteration-spec-")) / "iteration.yaml")
    Path(spec).write_text(
        f"extends: {args.spec}\nrun: {{name: bench-iteration}}\npipeline: {{eval_start: null, eval: null}}\n"
    )
    print("warm start (cached in the catalog, not timed) ...", flush=True)
    Runner(load_spec(spec, ["run.iterations=0", *args.overrides]), catalog).run()
    instrument()
    base = load_spec(spec, args.overrides).nodes
    groups = next(n.config.n_groups for n in base if n.name == "rollout")
    offset = int(time.time()) * 1000  # new initial states: fresh result keys, never cached ones
    walls: dict[int, float] = {}
    tables: dict[int, list[tuple[str, float]]] = {}
    peaks: dict[int, PeakRSS] = {}
    work: dict[int, dict[str, float]] = {}
    first_extra = 0.0
    for scale in (int(s) for s in args.scales.split(",")):
        peaks[scale] = PeakRSS()
        events, secs = run_iterations(
            catalog,
            spec,
            [*args.overrides, f"rollout.n_groups={groups * scale}", f"rollout.seed_offset={offset + scale}"],
        )
        peaks[scale].stop()
        second = [e for e in events if e.label.startswith("1:")]
        walls[scale] = sum(e.seconds for e in second)
        work[scale] = {
            name: sum(e.metrics.get(name, 0.0) for e in second)
            for name in ("rollout/sampled_tokens", "actor/tokens", "filter/kept_trajectories")
        }
        tables[scale] = _breakdown(second, secs, walls[scale])
        if len(tables) == 1:
            first_extra = sum(e.seconds for e in events if e.label.startswith("0:")) - walls[scale]
        print(f"{scale:>3}x trajectories: iteration wall {walls[scale]:6.1f} s", flush=True)
    first = min(walls)
    scales = sorted(walls)
    more = f", and at {', '.join(f'{s}x' for s in scales[1:])} the trajectories" if len(scales) > 1 else ""
    print(
        f"\none iteration of {args.spec} ({groups * first} groups = {first}x){more}: seconds, share of the "
        f"{first}x wall; x lin = seconds / (scale x the {first}x seconds)"
    )
    print(
        f"  {'':<40}"
        + "".join(f"{f'{s}x':>9}" for s in scales)
        + f"{'share':>8}"
        + "".join(f"{f'{s}x lin':>9}" for s in scales[1:])
    )
    for i, (name, base) in enumerate(tables[first]):
        cells = "".join(f"{tables[s][i][1]:9.2f}" for s in scales)
        lin = "".join(f"{tables[s][i][1] / (base * s / first):9.2f}" if base > 0.05 else f"{'':>9}" for s in scales[1:])
        tag = "  compute" if name in COMPUTE else ""
        print(f"  {name:<40}{cells}{base / walls[first]:8.1%}{lin}{tag}")
    print(
        f"  {'iteration wall':<40}"
        + "".join(f"{walls[s]:9.2f}" for s in scales)
        + f"{'':>8}"
        + "".join(f"{walls[s] / (walls[first] * s / first):9.2f}" for s in scales[1:])
    )
    # the work is not exactly proportional to the trajectories: episodes differ in length
    # and the filter keeps a varying number of groups; so also per unit of work
    per = (
        ("generate", "rollout/sampled_tokens", "per sampled token"),
        ("forward/backward", "actor/tokens", "per trained token"),
    )
    for name, unit, label in per:
        base = dict(tables[first])[name] / max(work[first][unit], 1)
        cells = "".join(f"{dict(tables[s])[name] / max(work[s][unit], 1) / base:9.2f}" for s in scales[1:])
        print(f"  {name + ' ' + label + ', x the 1x cost':<40}{'':>{9 * len(scales) + 8}}{cells}")
    print(
        "  work: "
        + "; ".join(
            f"{s}x: {work[s]['rollout/sampled_tokens']:,.0f} sampled tokens, "
            f"{work[s]['filter/kept_trajectories']:.0f} trajectories kept, "
            f"{work[s]['actor/tokens']:,.0f} tokens trained"
            for s in scales
        )
    )
    for s in scales:
        compute = sum(v for name, v in tables[s] if name in COMPUTE)
        print(
            f"compute share at {s}x: {compute / walls[s]:.2f} (target >= 0.85); peak memory {peaks[s].tree / 2**30:.2f}"
            f" GiB (PSS of the driver and every process it started, Ray's included; target <= 4 GiB), "
            f"driver RSS {peaks[s].driver / 2**30:.2f} GiB"
        )
    print(
        f"the first iteration took {first_extra:+.1f} s more than the second (Ray start, engine actor start, "
        "engine build)"
    )


def _breakdown(steps: list[StepEvent], secs: dict[str, float], wall: float) -> list[tuple[str, float]]:
    """(category, seconds) of one iteration, summing to its wall."""
    g = {
        name: sum(e.metrics.get(name, 0.0) for e in steps if e.node == "rollout")
        for name in ("perf/seconds", "perf/generate_seconds", "perf/load_seconds", "perf/play_seconds")
    }
    if not any(name in e.metrics for e in steps for name in ("perf/generate_seconds", "perf/play_seconds")):
        # a version without engine hosts (rollout in the driver): the driver's timer, and
        # the rest of the stage outside its metrics as the agent loop
        g["perf/generate_seconds"] = secs.get("generate (driver)", 0.0)
        g["perf/play_seconds"] = g["perf/seconds"] - secs.get("rollout metrics", 0.0)
    rows = [
        ("generate", g["perf/generate_seconds"]),
        ("forward/backward", secs.get("forward/backward", 0.0)),
        ("optimiser step", secs.get("optimiser step", 0.0)),
        ("critic forward", secs.get("critic forward", 0.0)),
        ("critic forward/backward", secs.get("critic forward/backward", 0.0)),
        (
            "agent loop and environments (actor)",
            g["perf/play_seconds"] - g["perf/generate_seconds"] - g["perf/load_seconds"],
        ),
        ("weight load into the engine (actor)", g["perf/load_seconds"]),
        ("rollout metrics (driver)", secs.get("rollout metrics", 0.0)),
        ("Ray Data and actor calls", g["perf/seconds"] - g["perf/play_seconds"] - secs.get("rollout metrics", 0.0)),
        ("checkpoint load (update, critic)", secs.get("checkpoint load", 0.0)),
        ("checkpoint save (update, critic)", secs.get("checkpoint save", 0.0)),
        ("Ray Train start and finish", secs.get("Ray Train fit", 0.0) - secs.get("in the training loop", 0.0)),
        ("Parquet read", secs.get("Parquet read", 0.0)),
        ("Arrow <-> tensors", secs.get("Arrow <-> tensors", 0.0)),
        ("commit (Parquet write, manifest)", secs.get("commit (Parquet write, manifest)", 0.0)),
    ]
    # disjoint: the update's forward/backward, optimiser steps, checkpoint load and save
    # and conversions are inside its training loop, and "Ray Train start and finish" is
    # the fit outside that loop (with the copy of the reported checkpoint)
    rows.append(("other (Python, metrics, planning)", wall - sum(s for _, s in rows)))
    return rows


if __name__ == "__main__":
    main()
