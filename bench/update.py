"""Update throughput: tokens/s of the update stage's training (Ray Train, local
mode) against a bare torch loop doing the same forward/backward/step on the
same batch.

A batch is made once (not timed): the embedded policy is warm-started and plays
one rollout (`configs/rollout.yaml`), and GRPO advantages are computed on it.
Then, on the same batch, with the same mini- and micro-batch sizes and epochs:

- bare: load the model, AdamW, and for every micro-batch a plain forward pass
  (full logits), the PPO loss, backward; clip and step per mini-batch;
- stage: `stages.training.fit.fit(actor_loop)` as the update stage runs it: the batch
  as a Ray Data dataset, Ray Train's local mode, the checkpoint (and optimiser
  state) saved and copied into the stage's output. `ray.init` is excluded (once
  per run, not per update).

Tokens are the batch's sequence lengths times the epochs. Target: stage / bare >= 0.9.

    python bench/update.py [--groups 8] [--group-size 16] [--epochs 1] [--catalog DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import torch

from catalog.store import Catalog
from pipelines.graph.load import load_spec
from pipelines.run.runner import Runner
from stages.advantage import AdvantageConfig, compute
from stages.models.policy import load_policy
from stages.training.fit import LocalContext, OptimConfig, fit
from stages.training.loops import ActorJob, actor_loop
from stages.update import UpdateConfig

COLUMNS = ["token_ids", "loss_mask", "logprobs", "advantages", "temperature"]


def make_batch(catalog: Catalog, groups: int, size: int) -> tuple[pa.Table, object]:
    """(advantage batch, policy ref) from one rollout of the warm-started policy."""
    spec = load_spec(
        "rollout.yaml",
        ["run.iterations=1", f"rollout.n_groups={groups}", f"rollout.group_size={size}", "rollout.actors=0"],
    )
    Runner(spec, catalog).run()
    keys = catalog.result_keys()
    rollout = catalog.ref(next(k for k in keys if k.startswith("rollout-")), "trajectories").read()
    policy = catalog.ref(next(k for k in keys if k.startswith("warmstart-")), "policy")
    batch, _ = compute(rollout, AdvantageConfig(estimator="grpo"), None)
    return batch.select(COLUMNS), policy


def bare(batch: pa.Table, policy_dir: Path, cfg: UpdateConfig) -> float:
    """Seconds of a plain PPO loop over the batch."""
    t0 = time.perf_counter()
    model, _ = load_policy(policy_dir, dtype="float32")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    rows = batch.to_pylist()
    mini, micro = cfg.optim.mini_batch_size, cfg.optim.micro_batch_size
    for _ in range(cfg.optim.epochs):
        for start in range(0, len(rows), mini):
            chunk = rows[start : start + mini]
            tokens = sum(sum(r["loss_mask"]) for r in chunk)
            for m in range(0, len(chunk), micro):
                part = chunk[m : m + micro]
                width = max(len(r["token_ids"]) for r in part)
                ids = torch.zeros((len(part), width), dtype=torch.long)
                attn, mask = torch.zeros_like(ids), torch.zeros_like(ids)
                old, adv = torch.zeros((len(part), width)), torch.zeros((len(part), width))
                for i, r in enumerate(part):
                    n = len(r["token_ids"])
                    ids[i, :n], attn[i, :n] = torch.tensor(r["token_ids"]), 1
                    mask[i, :n], old[i, :n] = torch.tensor(r["loss_mask"]), torch.tensor(r["logprobs"])
                    adv[i, :n] = torch.tensor(r["advantages"])
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
                logp = torch.log_softmax(logits / part[0]["temperature"], -1).gather(-1, ids[:, 1:, None])[..., 0]
                ratio = torch.exp(logp - old[:, 1:])
                a = adv[:, 1:]
                loss = torch.maximum(-a * ratio, -a * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high))
                ((loss * mask[:, 1:]).sum() / tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            opt.step()
            opt.zero_grad()
    return time.perf_counter() - t0


def stage(batch: pa.Table, policy: object, cfg: UpdateConfig) -> float:
    """Seconds of the update stage's training, local mode (ray.init excluded)."""
    ctx = LocalContext("bench-update")
    ctx.ray()
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        job = ActorJob(cfg=cfg, policy=policy, reference=policy, key="bench", seed=0)  # type: ignore[arg-type]
        fit(ctx, actor_loop, job, batch, cfg.optim, Path(out) / "policy")
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--catalog", default=None, help="catalog to keep the batch in (default: a temp dir)")
    args = parser.parse_args()
    catalog = Catalog(args.catalog or tempfile.mkdtemp(prefix="bench-update-"))
    print("warm start and one rollout (not timed) ...", flush=True)
    batch, policy = make_batch(catalog, args.groups, args.group_size)
    cfg = UpdateConfig(
        optim=OptimConfig(lr=1e-4, epochs=args.epochs, mini_batch_size=32, micro_batch_size=8), entropy_coef=0.0
    )
    tokens = sum(len(x) for x in batch["token_ids"].to_pylist()) * args.epochs
    bare_s, stage_s = float("inf"), float("inf")
    for _ in range(2):  # best of two, interleaved: no first-call penalty for either
        bare_s = min(bare_s, bare(batch, policy.local_path(), cfg))
        stage_s = min(stage_s, stage(batch, policy, cfg))
    print(
        f"\n{batch.num_rows} trajectories, {tokens:,} tokens, {args.epochs} epoch(s), "
        f"{torch.get_num_threads()} torch threads"
    )
    print(f"{'':<34}{'seconds':>9}{'tokens/s':>10}{'ratio':>7}")
    for name, seconds in (("bare torch loop", bare_s), ("update stage (Ray Train local)", stage_s)):
        print(f"{name:<34}{seconds:>9.2f}{tokens / seconds:>10,.0f}{bare_s / seconds:>7.2f}")


if __name__ == "__main__":
    main()
