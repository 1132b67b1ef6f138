"""The main job from an empty catalog: where its time goes, and how close its training is
to the machine.

Runs `pipeline run SPEC` for each spec given (today's default and a faster candidate,
by default), one after the other, each in a new process on a new catalog, with the same
run seed. For each it prints every stage's wall time and share of the run (read from
the catalog's `steps` view, as `pipeline query` would), the time outside any stage
(start-up, planning, Ray), and the final eval's success at T = 0.5. For the training
stages (pretrain, warmstart, update) it prints the model FLOP/s they reached against a
float32 matmul measured in this process (a ratio, so it holds across machines). Then
the ratio of the two runs' wall times.

Model FLOPs are the usual 6 x parameters per trained token (forward and backward; the
output head counted only where a token is predicted, attention's own products not
counted). The tokens are the stage's own: pretraining's steps x batch x the mean probe
length (its held-out states), the warm start's epochs x its demonstrations' tokens, and
the update's kept share of each iteration's rollout tokens. The pipeline runs a prompt
prefix that every row of a batch shares once (`stages.models.forward`), so a stage can
reach a ratio above what its matrix products do.

    python bench/main_job.py                                    # the default, then starpo-2-layers.yaml (about 25 min)
    python bench/main_job.py --specs starpo.yaml --seed 1       # one spec
    python bench/main_job.py --save main-job --keep CATALOGS   # each run's catalog kept (CATALOGS/<spec>)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.machine import matmul_gflops  # noqa: E402
from common.recording import Recorder, run_script  # noqa: E402

#: today's default, and the faster candidate measured against it (two layers, 3,000 pretraining steps)
SPECS = ("starpo.yaml", "starpo-2-layers.yaml")
#: the stages the table shows apart (any other counts as "other stages")
GROUPS = ("pretrain", "warmstart", "rollout", "update", "eval")


@dataclass
class Run:
    """One spec's run: its wall time and what the catalog says of it."""

    spec: str
    wall: float
    seconds: dict[str, float] = field(default_factory=dict)  # group -> seconds
    counts: dict[str, int] = field(default_factory=dict)  # group -> stage runs
    flops: dict[str, float] = field(default_factory=dict)  # training group -> model FLOPs
    success: float | None = None


def _per_token(spec: Any) -> tuple[float, float]:
    """(body, head) model FLOPs per trained token of the spec's embedded policy (6 x
    parameters; the head's only where a token is predicted)."""
    model = next(n.config for n in spec.nodes if n.stage.name == "policy.init")
    if model.path is not None:
        raise SystemExit(f"error: {spec.file}: model.path is set; this bench counts the embedded model's FLOPs")
    e = model.embedded
    body = e.block_parameters()
    return 6.0 * body, 6.0 * e.hidden_size * e.vocab_size


def _probe_length(spec: Any) -> tuple[float, float]:
    """Mean tokens and mean answer tokens of a pretraining chat, over its held-out states,
    drawn as the stage draws them (balanced or not)."""
    from stages.agent.corpus import embedded_tokenizer
    from stages.pretrain import held_out_seeds
    from stages.training.pretrain import answer_balance, probe_samples

    node = next(n for n in spec.nodes if n.stage.name == "pretrain")
    cfg = node.config
    model = next(n.config for n in spec.nodes if n.stage.name == "policy.init")
    tokenizer = embedded_tokenizer(model.embedded.vocab_size)
    pairs = []
    for i, name in enumerate(cfg.envs):
        options = (cfg.env_options or {}).get(name)
        pairs += probe_samples(name, options, held_out_seeds(i, cfg.held_out), tokenizer, cfg.agent, cfg.per_chat)
    weights = (answer_balance(pairs) if cfg.balance else None) or [1.0] * len(pairs)
    total = sum(weights)
    length = sum(w * len(s.ids) for w, (_, s) in zip(weights, pairs)) / total
    answer = sum(w * sum(t != -100 for t in s.labels) for w, (_, s) in zip(weights, pairs)) / total
    return length, answer


def _flops(spec: Any, catalog: Any, run: str, per_token: tuple[float, float]) -> dict[str, float]:
    """Model FLOPs of each training stage of the run (the module docstring), from the
    (body, head) FLOPs of a trained token."""
    from catalog.query import query

    body, head = per_token
    out: dict[str, float] = {}
    pre = next((n for n in spec.nodes if n.stage.name == "pretrain"), None)
    if pre is not None:
        length, answer = _probe_length(spec)
        chats = pre.config.steps * pre.config.batch_size
        out["pretrain"] = chats * (length * body + answer * head)
    warm = next((n for n in spec.nodes if n.stage.name == "warmstart"), None)
    if warm is not None:
        row = query(
            catalog,
            f"select sum(len(token_ids)), sum(list_sum(loss_mask)) from demonstrations where run = '{run}'",
        ).to_pylist()[0]
        tokens, predicted = (float(v or 0) for v in row.values())
        out["warmstart"] = warm.config.epochs * (tokens * body + predicted * head)
    update = query(
        catalog,
        f"with kept as (select iteration, value from metrics where run = '{run}' and name = 'filter/kept_groups'), "
        'groups as (select iteration, count(distinct "group") as n, sum(len(token_ids)) as tokens, '
        f"sum(list_sum(loss_mask)) as predicted from trajectories where run = '{run}' group by iteration) "
        "select sum(kept.value / groups.n * groups.tokens), sum(kept.value / groups.n * groups.predicted) "
        "from kept join groups using (iteration)",
    ).to_pylist()[0]
    tokens, predicted = (float(v or 0) for v in update.values())
    out["update"] = tokens * body + predicted * head
    return out


def run_spec(spec_path: str, seed: int, folder: Path, overrides: list[str]) -> Run:
    """`pipeline run` on a new catalog, then the catalog's account of it."""
    from catalog.query import query
    from catalog.store import Catalog
    from pipelines.graph.load import load_spec

    spec = load_spec(spec_path, (f"run.seed={seed}", *overrides))
    per_token = _per_token(spec)  # a spec this bench cannot count stops here, before its run
    catalog_dir = folder / Path(spec_path).stem
    if catalog_dir.exists() and any(catalog_dir.iterdir()):
        raise SystemExit(f"error: {catalog_dir}: not empty; the bench times a run from an empty catalog")
    command = [shutil.which("pipeline") or "pipeline", "run", spec_path, "--catalog", str(catalog_dir)]
    for text in (f"run.seed={seed}", *overrides):
        command += ["-o", text]
    print(f"$ {' '.join(command[1:])}", flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"error: {spec_path}: the run failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    catalog = Catalog(str(catalog_dir))
    run = spec.name
    out = Run(spec_path, wall)
    rows = query(
        catalog, f"select stage, count(*) as n, sum(seconds) as s from steps where run = '{run}' group by stage"
    )
    for row in rows.to_pylist():
        group = row["stage"] if row["stage"] in GROUPS else "other stages"
        out.seconds[group] = out.seconds.get(group, 0.0) + row["s"]
        out.counts[group] = out.counts.get(group, 0) + row["n"]
    last = query(
        catalog,
        f"select avg(success::int) as s from evals where run = '{run}' and temperature = 0.5 and "
        f"policy_version = (select max(policy_version) from evals where run = '{run}')",
    ).to_pylist()
    out.success = last[0]["s"] if last else None
    out.flops = _flops(spec, catalog, run, per_token)
    return out


def table(out: Recorder, run: Run, rate: float) -> None:
    """The stage table of one run."""
    out.line(f"`{run.spec}`: {run.wall:.0f} s, final eval (T = 0.5) {100 * (run.success or 0):.1f}%")
    out.line()
    out.line("| stage | runs | seconds | share | model GFLOP/s | of the matmul |")
    out.line("|---|---|---|---|---|---|")
    order = [*GROUPS, "other stages"]
    for group in order:
        if group not in run.seconds:
            continue
        s = run.seconds[group]
        gflops = run.flops.get(group)
        rated = f"{gflops / s / 1e9:.1f} | {gflops / s / 1e9 / rate:.2f}" if gflops and s else "- | -"
        out.line(f"| {group} | {run.counts[group]} | {s:.0f} | {100 * s / run.wall:.0f}% | {rated} |")
    outside = run.wall - sum(run.seconds.values())
    out.line(f"| outside the stages | | {outside:.0f} | {100 * outside / run.wall:.0f}% | - | - |")
    out.line(f"| **the run** | | **{run.wall:.0f}** | | | |")
    out.line()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--specs", default=",".join(SPECS), help="specs to run, comma-separated (the first is the baseline)"
    )
    ap.add_argument("--seed", type=int, default=0, help="the run seed of every spec")
    ap.add_argument("-o", "--override", action="append", default=[], help="an override for every spec (KEY=VALUE)")
    ap.add_argument("--save", default="", help="write bench/results/NAME.json")
    ap.add_argument("--keep", default="", help="keep each run's catalog in this folder (default: a temporary one)")
    args = ap.parse_args()
    out = Recorder()
    rate = matmul_gflops()
    out.line(f"float32 matmul (1024 x 1024, this process): {rate:.0f} GFLOP/s")
    out.line()
    runs = []
    with tempfile.TemporaryDirectory(prefix="main-job-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        for spec in args.specs.split(","):
            runs.append(run_spec(spec, args.seed, folder, args.override))
            table(out, runs[-1], rate)
    for later in runs[1:]:
        out.line(f"wall time `{later.spec}` / `{runs[0].spec}`: {later.wall / runs[0].wall:.2f}x")
    if args.save:
        data = {
            "matmul_gflops": rate,
            "runs": [
                {"spec": r.spec, "wall_s": r.wall, "seconds": r.seconds, "flops": r.flops, "success": r.success}
                for r in runs
            ],
        }
        out.save(args.save, data)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_script(main)
