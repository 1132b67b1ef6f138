"""The update stage: PPO on the actor (docs/method.md#the-update-starpo).

`update` trains the policy on the advantage batch and commits the next policy
version; an empty batch (the filter kept no group) keeps the weights under the next
version number. With ``optim.workers: 0`` and a full fine-tune it trains the run's
resident trainer, which keeps the policy and its optimiser state in memory between
updates and stores a version only where something reads it from storage
(`stages.training.resident`, ``checkpoint_every``); otherwise every update is a Ray
Train fit (`stages.training.fit`, loop in `stages.training.loops.actor_loop`) from the
stored policy, and every version is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from catalog.datasets import Artifact, ArtifactRef, TableRef
from common.config import ConfigProblem, param
from stages.registry import StageContext, StageResult, stage, trainer_claims
from stages.training import resident
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
    lr_decay_to: float = param(
        1.0,
        "the learning rate falls linearly from optim.lr at the first update to this share of it at update "
        "lr_decay_over, and stays there; 1: constant",
        gt=0,
        le=1,
    )
    lr_decay_over: int = param(0, "updates the decay takes (needed with lr_decay_to < 1)", ge=0)
    resident: bool = param(
        True,
        "keep the policy and its optimiser state in a trainer that lives for the run (in this process, or a "
        "worker group of optim.workers started once); false: every update loads the stored policy into a new Ray "
        "Train fit and stores every version (the path FSDP and LoRA take)",
    )
    checkpoint_every: int = param(
        10,
        "store the policy and its optimiser state every this many versions (and at the last update, and "
        "wherever a stage reads the policy from storage: eval, mutual_info); in between, the policy stays in "
        "the run's trainer and reaches the engines from memory, and its result holds only its digest and how "
        "to rebuild it (docs/architecture.md#the-state-model). 1: store every version. With resident: false, "
        "strategy fsdp or LoRA every version is stored",
        ge=1,
        key=False,
    )

    def __post_init__(self) -> None:
        if self.lr_decay_to < 1.0 and self.lr_decay_over < 1:
            raise ConfigProblem("lr_decay_over", "a decaying learning rate needs the updates it takes (>= 1)")


def scheduled(cfg: UpdateConfig, iteration: int | None) -> UpdateConfig:
    """`cfg` with the learning rate of update `iteration` (0-based; None: the first):
    `optim.lr` falling linearly to `lr_decay_to` of it over `lr_decay_over` updates."""
    if cfg.lr_decay_to == 1.0:
        return cfg
    done = min(iteration or 0, cfg.lr_decay_over) / cfg.lr_decay_over
    return replace(cfg, optim=replace(cfg.optim, lr=cfg.optim.lr * (1.0 - (1.0 - cfg.lr_decay_to) * done)))


def _store(cfg: UpdateConfig, iteration: int | None) -> bool:
    """Whether the version update `iteration` makes is stored whole by its own rule
    (version i + 1: every `checkpoint_every`-th)."""
    if not cfg.resident or cfg.optim.strategy != "ddp":
        return True
    return iteration is None or (iteration + 1) % cfg.checkpoint_every == 0


@stage(
    "update",
    config=UpdateConfig,
    outputs={"policy": Artifact("the next policy version", resident=True)},
    claims=lambda cfg: trainer_claims("update", cfg.optim, held=cfg.resident and cfg.optim.strategy == "ddp"),
    wiring={"policy": "policy@prev", "reference": "policy@once"},
    store=_store,
    in_memory=("policy",),
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
        "perf/state_seconds": "seconds the resident trainer spent bringing the policy in (loading it, or rebuilding a "
        "version kept in memory), storing the new version (or its digest and recipe) and handing its weights to the "
        "engines (stages.training.resident)",
    },
)
def update(
    ctx: StageContext, cfg: UpdateConfig, batch: TableRef, policy: ArtifactRef, reference: ArtifactRef
) -> StageResult:
    """PPO on the actor over the advantage batch; the next policy version."""
    cfg = scheduled(cfg, ctx.iteration)
    from stages.models.batching import per_sample
    from stages.training.fit import check_state_kept, fit, keep_checkpoint
    from stages.training.loops import ActorJob, actor_loop, proximal_logprobs

    if cfg.resident and resident.supports(cfg, policy):
        metrics = resident.update(ctx, cfg, policy, reference, batch, ctx.output_dir("policy"))
        return StageResult(metrics=metrics)
    stale = cfg.correction == "decoupled"
    check_state_kept(policy, cfg.optim)
    table = per_sample(batch.read(columns=resident.COLUMNS + (["staleness"] if stale else [])))
    if table.num_rows == 0:
        keep_checkpoint(policy.local_path(), ctx.output_dir("policy"), "policy.json", ctx.key)
        return StageResult(metrics={"actor/tokens": 0.0})
    if stale:
        with resident.loaded(policy) as model:
            table = proximal_logprobs(table, model, cfg.optim.micro_batch_size)
    job = ActorJob(key=ctx.key, seed=ctx.step_seed, cfg=cfg, policy=policy, reference=reference)
    metrics = fit(ctx, actor_loop, job, table, cfg.optim, ctx.output_dir("policy"))
    return StageResult(metrics=metrics)


resident.register(UpdateConfig)
