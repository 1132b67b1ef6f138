"""DuckDB at scale: the README's ready queries over a million stored trajectories.

Writes ``--trajectories`` synthetic trajectories (the real schema, ``--turns``
turns each, token lists of ``--tokens`` per turn) into a fresh catalog, as
committed rollout results of ``--per-result`` rows (plus one eval result per 100k
trajectories), then runs each ready query of README.md (between its
``ready-queries`` markers) through ``pipeline query`` as a user does: a new
process each time, timed from start to exit (median of ``--repeat``), against the
target of 1 s. The catalog's size on disk and the write time are printed too.

    python bench/query.py [--trajectories 1000000] [--turns 10] [--catalog DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import pyarrow as pa

from catalog.datasets import Table
from catalog.runs import RunLog, RunRecord, StepRecord
from catalog.schemas import TRAJECTORY_SCHEMA, TURN
from catalog.store import Catalog
from catalog.views import write_views_sql

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["Left", "Down", "Right", "Up"]


def ready_queries() -> list[str]:
    """The README's ready queries, as the SQL given to `pipeline query`."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- ready-queries -->", 1)[1].split("<!-- /ready-queries -->", 1)[0]
    return [shlex.split(line)[2] for line in block.splitlines() if line.startswith("pipeline query")]


def _lists(values: np.ndarray, n: int, width: int, type: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)), pa.array(values)
    ).cast(type)


def synthetic(n: int, turns: int, tokens: int, iteration: int, split: str, rng: np.random.Generator) -> pa.Table:
    """`n` trajectories of `turns` turns in the trajectory schema (16 per group)."""
    k = n * turns
    actions = rng.integers(0, 4, k)
    ok = rng.random(k) > 0.05
    response = np.array([f"<answer>{WORDS[a]}</answer>" for a in range(4)], dtype=object)[actions]
    response = np.where(ok, response, "Up Up")
    state = np.array(
        [f"goal: {d} down, {r} right. Left: wall. Down: frozen." for d in range(4) for r in range(4)], dtype=object
    )[rng.integers(0, 16, k)]
    turn_struct = pa.StructArray.from_arrays(
        [
            pa.array(np.tile(np.arange(1, turns + 1, dtype=np.int32), n)),
            pa.array(state, pa.string()),
            pa.array(response, pa.string()),
            pa.nulls(k, pa.string()),
            pa.array(response, pa.string()),
            _lists(np.array(WORDS, dtype=object)[actions], k, 1, pa.list_(pa.string())),
            _lists(ok, k, 1, pa.list_(pa.bool_())),
            pa.array(ok.astype(np.int32)),
            pa.array(rng.random(k) * (rng.random(k) < 0.1)),
            pa.array(ok),
            pa.array(np.ones(k, bool)),
            pa.array(np.full(k, tokens, np.int32)),
        ],
        fields=list(TURN),
    )
    width = turns * tokens * 2  # prompt and response tokens of every turn
    success = rng.random(n) < 0.5
    columns = {
        "run": pa.array(["bench"] * n),
        "iteration": pa.array(np.full(n, iteration)),
        "policy_version": pa.array(np.full(n, iteration)),
        "policy_key": pa.array(["policy-bench"] * n),
        "env": pa.array(["frozenlake"] * n),
        "env_options": pa.array(['{"render": "local"}'] * n),
        "seed": pa.array(np.arange(n) // 16 + iteration * n),
        "group": pa.array(np.arange(n) // 16),
        "sample": pa.array(np.arange(n) % 16),
        "split": pa.array([split] * n),
        "temperature": pa.array(np.ones(n)),
        "token_ids": _lists(rng.integers(0, 600, n * width, dtype=np.int32), n, width, pa.list_(pa.int32())),
        "loss_mask": _lists(
            np.tile(np.repeat(np.array([0, 1], np.int8), tokens), n * turns), n, width, pa.list_(pa.int8())
        ),
        "logprobs": _lists(-rng.random(n * width, dtype=np.float32), n, width, pa.list_(pa.float32())),
        "turns": pa.ListArray.from_arrays(pa.array(np.arange(0, k + 1, turns, dtype=np.int32)), turn_struct),
        "score": pa.array(success.astype(float)),
        "success": pa.array(success),
        "num_turns": pa.array(np.full(n, turns, np.int32)),
        "num_actions": pa.array(np.full(n, turns, np.int32)),
        "format_valid_rate": pa.array(np.full(n, 0.95)),
        "response_tokens": pa.array(np.full(n, turns * tokens)),
        "end_reason": pa.array(["done"] * n),
        "truncated_context": pa.array(np.zeros(n, bool)),
        "truncated_response": pa.array(np.zeros(n, bool)),
        "segments": _lists(np.full(n * turns, 2 * tokens, np.int32), n, turns, pa.list_(pa.int32())),
    }
    columns["staleness"] = pa.array(np.zeros(n, np.int64))
    columns["explored_turns"] = pa.array([[]] * n, pa.list_(pa.int32()))
    return pa.table(columns).select(TRAJECTORY_SCHEMA.names).cast(TRAJECTORY_SCHEMA)


def fill(catalog: Catalog, total: int, per: int, turns: int, tokens: int) -> None:
    rng = np.random.default_rng(0)
    chunk = synthetic(per, turns, tokens, 0, "train", rng)
    for i in range(total // per):
        table = chunk.set_column(1, "iteration", pa.array(np.full(per, i))).set_column(
            2, "policy_version", pa.array(np.full(per, i))
        )
        catalog.writer(f"rollout-bench{i:05d}", {"trajectories": Table(view="trajectories")}).commit(
            {"trajectories": table},
            {"rollout/success_rate": 0.5},
            {"stage": "rollout", "version": 2, "node": "rollout", "run": "bench", "iteration": i},
        )
    evals = synthetic(1000, turns, tokens, 0, "validation", rng)
    for i in range(max(1, total // 100_000)):
        catalog.writer(f"eval-bench{i:05d}", {"evals": Table(view="evals")}).commit(
            {"evals": evals.set_column(2, "policy_version", pa.array(np.full(1000, i * 10)))},
            {"eval/success_rate": 0.5},
            {"stage": "eval", "version": 2, "node": "eval", "run": "bench", "iteration": i * 10},
        )
    # the run's record: the views show a result's rows under the runs that used it
    log = RunLog(catalog.root, RunRecord("bench", "bench.yaml", "", total // per, 0))
    for key in catalog.result_keys():
        m = catalog.manifest(key)
        log.add_step(StepRecord("bench", m["iteration"], m["node"], m["stage"], key, "ran", 0.0, time.time()))
    log.finish("finished")
    write_views_sql(catalog)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trajectories", type=int, default=1_000_000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=8, help="prompt and response tokens per turn, each")
    parser.add_argument("--per-result", type=int, default=10_000, help="trajectories per rollout result")
    parser.add_argument("--catalog", default=None, help="where to write (default: a temp dir); reused if filled")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(args.catalog or tempfile.mkdtemp(prefix="bench-query-"))
    catalog = Catalog(str(root))
    if not catalog.result_keys():
        t0 = time.perf_counter()
        fill(catalog, args.trajectories, args.per_result, args.turns, args.tokens)
        print(f"wrote {args.trajectories:,} trajectories x {args.turns} turns in {time.perf_counter() - t0:.0f} s")
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"catalog {root}: {size / 2**30:.2f} GiB on disk\n")
    exe = Path(sys.executable).parent / "pipeline"
    print(f"{'seconds':>8}  {'rows':>6}  query (median of {args.repeat} runs of `pipeline query`, target 1 s)")
    for sql in ready_queries():
        times, rows = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            done = subprocess.run(
                [str(exe), "query", sql, "--catalog", str(root), "--format", "csv"], capture_output=True, text=True
            )
            times.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise SystemExit(f"query failed: {sql}\n{done.stderr}")
            rows = max(0, len(done.stdout.splitlines()) - 1)
        median, short = statistics.median(times), re.sub(r"\s+", " ", sql)[:110]
        print(f"{median:8.2f}  {rows:>6}  {'ok ' if median <= 1 else 'SLOW'} {short}")


if __name__ == "__main__":
    main()
