"""Is a warm start reproduced on this machine? The same spec's once-stages (`pipeline run
SPEC --to eval_start`: the model, the warm start, its eval) computed several ways, each in
its own scratch catalog so that nothing is taken from a cache, and one table row per way:
the warm start's result key, the digest of its weights, and the eval's success.

    python experiments/reproduce.py --spec starpo-gemma3-sokoban.yaml \\
        -o run.seed=1 -o warmstart.episodes=16 -o warmstart.epochs=1 -o eval.episodes=32

The ways: a plain run, the same again, a plain run with one torch thread
(`OMP_NUM_THREADS=1`; a plain run takes torch's default, the machine's cores), and a
one-trial sweep of the same point (a Ray Tune trial process with `trial_cpus: 2`, with
`run.iterations=1`, so one iteration runs after the warm start). Same key and same digest:
the result is reproduced bit for bit; same key, another digest: the floats moved (threads,
the machine's kernels), and the eval shows how far that carries. Before every run set its
torch threads (`common.machine.pin_threads`), the sweep trial's weights differed from
the plain runs' here (docs/architecture.md, "A lost trainer is rebuilt").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import Catalog
from common.errors import UserError
from common.recording import Recorder, run_script
from pipelines.spec.yamlio import find_spec

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _weights(root: Path, key: str) -> str:
    """The first 12 hex digits of the SHA-256 of the result's weights, from its manifest."""
    files = json.loads((root / "results" / key / "manifest.json").read_text())["files"]
    name = next(f for f in files if f.endswith("model.safetensors"))
    return str(files[name]["sha256"])[:12]


def _row(way: str, root: Path, seconds: float) -> str:
    catalog = Catalog(str(root))
    mine = "run not like '%-shared'"  # a sweep's shared once-stages run under <sweep>-shared
    key = query(catalog, f"select key from steps where {mine} and node = 'warmstart'").to_pylist()[0]["key"]
    ev = query(
        catalog,
        f"select avg(success::int) s, count(*)::bigint n from evals where {mine} and policy_version = 0 "
        "and temperature > 0",
    ).to_pylist()[0]
    machine = query(catalog, f"select machine from runs where {mine}").to_pylist()[0]["machine"]
    threads = json.loads(machine).get("threads", "?") if machine else "?"
    return (
        f"| {way} | {threads} | {key} | {_weights(root, key)} | {100 * ev['s']:.1f}% of {ev['n']} | {seconds:.0f} s |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="a spec under configs/")
    ap.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE, as pipeline run takes")
    ap.add_argument("--keep", default=None, help="keep the scratch catalogs under this folder")
    ap.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    args = ap.parse_args()
    spec = find_spec(args.spec)  # a preset, a recipe under configs/experiments/, or a path (one line if none)
    bad = [o for o in args.override if "=" not in o]
    if bad:
        raise UserError(f"-o {bad[0]}: expected KEY=VALUE")
    fixed: dict[str, object] = {}
    for o in args.override:
        key, value = o.split("=", 1)
        try:
            fixed[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(f"-o {o}: {value!r} is not a YAML value") from None
    seed = fixed.pop("run.seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"-o run.seed={seed}: expected an integer")
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        _ways(args, spec, Path(args.keep), fixed, seed)
    else:  # the scratch catalogs go with the script, however it ends
        with tempfile.TemporaryDirectory(prefix="reproduce-") as scratch:
            _ways(args, spec, Path(scratch), fixed, seed)


def _ways(args: argparse.Namespace, spec: Path, where: Path, fixed: dict[str, object], seed: int) -> None:
    """Compute the warm start the four ways, each in its own catalog under `where`."""
    pipeline = str(Path(sys.executable).parent / "pipeline")
    overrides = [x for o in args.override for x in ("-o", o)]
    sweep = where / "sweep.yaml"
    sweep.write_text(
        json.dumps(
            {
                "sweep": {
                    "base": str(spec),
                    "metric": "eval/success_rate",
                    "max_concurrent_trials": 1,
                    "trial_cpus": 2,
                },
                "overrides": {**fixed, "run.iterations": 1},
                "space": {"run.seed": {"grid": [seed]}},
            }
        )
    )
    ways = [
        ("plain run", [pipeline, "run", str(spec), "--to", "eval_start", *overrides], {}),
        ("plain run, again", [pipeline, "run", str(spec), "--to", "eval_start", *overrides], {}),
        (
            "plain run, 1 thread",
            [pipeline, "run", str(spec), "--to", "eval_start", *overrides],
            {"OMP_NUM_THREADS": "1"},
        ),
        ("sweep trial", [pipeline, "sweep", str(sweep)], {}),
    ]
    out = Recorder()
    out.line(f"{args.spec} {' '.join(args.override)}: the warm start computed four ways, each in its own catalog")
    out.line("| way | torch threads | warm start key | weights sha256 | eval v0 (T > 0) | wall |")
    out.line("|---|---|---|---|---|---|")
    for i, (way, cmd, env) in enumerate(ways):
        root = where / f"way{i}"
        t = time.time()
        done = subprocess.run(
            [*cmd, "--catalog", str(root)], cwd=CONFIGS, env={**os.environ, **env}, capture_output=True, text=True
        )
        if done.returncode != 0:
            last = ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
            sys.exit(f"error: {way}: exit {done.returncode}: {last}")
        out.line(_row(way, root, time.time() - t))
    if args.save:
        out.save(args.save)


if __name__ == "__main__":
    run_script(main)
