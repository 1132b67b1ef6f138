"""The update stage: PPO on the actor (docs/method.md#the-update-starpo).

`update` trains the policy on the advantage batch under Ray Train
(`stages.training.fit`, loop in `stages.training.loops.actor_loop`) and commits the
next policy version; an empty batch (the filter kept no group) keeps the weights
under the next version number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from catalog.datasets import Artifact, ArtifactRef, TableRef
from common.config import param
from stages.registry import StageContext, StageResult, stage
from stages.training.fit import RESTARTS_METRIC, OptimConfig

ACTOR_OPTIM = OptimConfig(lr=1e-4)


@dataclass(frozen=True)
class UpdateConfig:
    """`update:` — the PPO actor update."""

    optim: OptimConfig = param(
        ACTOR_OPTIM, "optimiser, batch sizes, epochs and Ray Train workers (paper: lr 1e-6 for a 0.5B model)"
    )
    clip_ratio_low: float = param(0.2, "ratio clip below: 1 - clip_ratio_low (reference: 0.2)", ge=0, le=1)
    clip_ratio_high: float = param(0.28, "ratio clip above: 1 + clip_ratio_high (StarPO-S: 0.28, vanilla: 0.2)", ge=0)
    clip_ratio_c: float | None = param(
        3.0, "dual clip: a negative advantage's loss is at most -adv * clip_ratio_c (None: off; reference: 3.0)", gt=1
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = param("token-mean", "how token losses are averaged")
    entropy_coef: float = param(0.001, "entropy bonus coefficient (reference: 0.001)", ge=0)
    kl_coef: float = param(0.0, "KL-to-reference loss coefficient (StarPO-S: 0; vanilla: 0.001)", ge=0)
    kl_estimator: Literal["k1", "k3"] = param("k3", "KL estimator: k1 (log-ratio) or k3 (low-variance)")
    correction: Literal["none", "decoupled"] = param(
        "none",
        "off-policy correction for stale rollouts (a rollout wired policy@prev:k): decoupled clips the ratio "
        "against the proximal policy (the one being updated, as it was before this update; its log-probs are "
        "recomputed for the stale samples only) and weights each token by pi_prox / pi_behaviour truncated at "
        "is_cap (AReaL, verl's truncated IS); none: the ratio is taken against the sampling log-probs. Without "
        "staleness both are PPO's loss",
    )
    is_cap: float = param(2.0, "truncation of the decoupled objective's importance weight", gt=0)


def with_proximal_logprobs(table: Any, policy: ArtifactRef, micro: int) -> Any:
    """`table` with ``prox_logprobs``: the log-probs of the policy being updated at each
    sampled token, recomputed for the samples with staleness > 0 and the sampling
    log-probs elsewhere (there the proximal policy is the one that sampled)."""
    import numpy as np
    import pyarrow as pa
    import torch

    from stages.models.batching import lengths, padded
    from stages.models.forward import sampled_logprobs
    from stages.models.policy import load_policy

    stale = np.array([(s or 0) > 0 for s in table.column("staleness").to_pylist()])
    prox = table.column("logprobs").to_pylist()
    rows = np.flatnonzero(stale)
    if len(rows):
        model = load_policy(policy.local_path(), dtype="float32")[0].eval()
        sizes = lengths(table)
        with torch.no_grad():
            for start in range(0, len(rows), micro):
                part = rows[start : start + micro]
                b = padded(table, part, {"token_ids": torch.long, "loss_mask": torch.long})
                temps = torch.tensor([table.column("temperature")[int(r)].as_py() for r in part], dtype=torch.float32)
                logp, _ = sampled_logprobs(model, b["token_ids"], b["attention"], b["loss_mask"], temps)
                for i, r in enumerate(part):
                    prox[r] = (logp[i, : sizes[r]] * b["loss_mask"][i, : sizes[r]]).tolist()
    return table.append_column("prox_logprobs", pa.array(prox, pa.list_(pa.float32())))


@stage(
    "update",
    config=UpdateConfig,
    outputs={"policy": Artifact("the next policy version")},
    wiring={"policy": "policy@prev", "reference": "policy@once"},
    version=2,
    metrics={
        "actor/pg_loss": "PPO clipped surrogate loss (aggregated as loss_agg)",
        "actor/entropy": "mean entropy of the policy at the sampled tokens",
        "actor/clipfrac_low": "fraction of sampled tokens where the lower ratio clip binds (adv < 0)",
        "actor/clipfrac_high": "fraction of sampled tokens where the upper ratio clip binds (adv > 0)",
        "actor/dual_clipfrac": "fraction of sampled tokens where the dual clip binds",
        "actor/approx_kl": "mean of old_logp - logp over sampled tokens (k1 KL(old || new))",
        "actor/kl_ref": "KL to the reference policy (only with kl_coef > 0)",
        "actor/grad_norm": "actor gradient norm before clipping, mean over optimiser steps",
        "actor/lr": "actor learning rate",
        "actor/tokens": "sampled tokens trained on (0: the batch was empty, the policy is kept)",
        "actor/is_weight": "correction: decoupled: mean truncated importance weight pi_prox / pi_behaviour",
        **RESTARTS_METRIC,
    },
)
def update(
    ctx: StageContext, cfg: UpdateConfig, batch: TableRef, policy: ArtifactRef, reference: ArtifactRef
) -> StageResult:
    """PPO on the actor over the advantage batch; the next policy version."""
    from stages.models.batching import per_sample
    from stages.training.fit import check_state_kept, fit, keep_checkpoint
    from stages.training.loops import ActorJob, actor_loop

    columns = ["token_ids", "loss_mask", "logprobs", "advantages", "temperature", "segments"]
    stale = cfg.correction == "decoupled"
    check_state_kept(policy, cfg.optim)
    table = per_sample(batch.read(columns=columns + (["staleness"] if stale else [])))
    if table.num_rows == 0:
        keep_checkpoint(policy.local_path(), ctx.output_dir("policy"), "policy.json", ctx.key)
        return StageResult(metrics={"actor/tokens": 0.0})
    if stale:
        table = with_proximal_logprobs(table, policy, cfg.optim.micro_batch_size)
    job = ActorJob(key=ctx.key, seed=ctx.step_seed, cfg=cfg, policy=policy, reference=reference)
    metrics = fit(ctx, actor_loop, job, table, cfg.optim, ctx.output_dir("policy"))
    return StageResult(metrics=metrics)
