"""The update stage: PPO on the actor (docs/method.md#the-update-starpo).

`update` trains the policy on the advantage batch under Ray Train
(`stages.training.fit`, loop in `stages.training.loops.actor_loop`) and commits the
next policy version; an empty batch (the filter kept no group) keeps the weights
under the next version number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from catalog.datasets import Artifact, ArtifactRef, TableRef
from common.config import param
from stages.registry import StageContext, StageResult, stage
from stages.training.fit import OptimConfig

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
    },
)
def update(
    ctx: StageContext, cfg: UpdateConfig, batch: TableRef, policy: ArtifactRef, reference: ArtifactRef
) -> StageResult:
    """PPO on the actor over the advantage batch; the next policy version."""
    from stages.models.batching import per_sample
    from stages.training.fit import fit, keep_checkpoint
    from stages.training.loops import ActorJob, actor_loop

    table = per_sample(
        batch.read(columns=["token_ids", "loss_mask", "logprobs", "advantages", "temperature", "segments"])
    )
    if table.num_rows == 0:
        keep_checkpoint(policy.local_path(), ctx.output_dir("policy"), "policy.json", ctx.key)
        return StageResult(metrics={"actor/tokens": 0.0})
    job = ActorJob(key=ctx.key, seed=ctx.step_seed, cfg=cfg, policy=policy, reference=reference)
    metrics = fit(ctx, actor_loop, job, table, cfg.optim, ctx.output_dir("policy"))
    return StageResult(metrics=metrics)
