"""The critic stages: `critic.init` puts a value head on a copy of the policy;
`critic.update` trains it with the clipped value loss on the batch's returns
(loop in `stages.training.loops.critic_loop`) and commits the next critic version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from catalog.datasets import Artifact, ArtifactRef, TableRef
from common.config import ConfigProblem, param
from stages.models.critic import critic_base
from stages.registry import Neighbours, StageContext, StageResult, stage, trainer_claims
from stages.rl.registry import ESTIMATORS
from stages.training import critic_trainer
from stages.training.fit import RESTARTS_METRIC, OptimConfig


@dataclass(frozen=True)
class CriticConfig:
    """`critic:` — the value-head update."""

    optim: OptimConfig = param(OptimConfig(lr=1e-3), "optimiser of the critic (reference: 10x the actor's lr)")
    cliprange_value: float | None = param(
        0.5, "clip of the value change against the batch's values (None: off; reference: 0.5)", gt=0
    )
    resident: bool = param(
        True,
        "with optim.workers 0 and no LoRA, keep the critic and its optimiser state in this process between "
        "updates (every version is still stored; stages.training.critic_trainer); false: every update loads the "
        "stored critic into a new Ray Train fit",
    )


@dataclass(frozen=True)
class CriticInitConfig:
    """`critic.init:` — nothing to set: the value head sits on a copy of the policy."""


@stage(
    "critic.init",
    config=CriticInitConfig,
    outputs={"critic": Artifact("the first critic")},
    wiring={"policy": "policy"},
)
def init_critic(ctx: StageContext, cfg: CriticInitConfig, policy: ArtifactRef) -> StageResult:
    """A value head on the (warm-started) policy: critic version 0. With LoRA, an
    adapter and the head on the policy's frozen weights, which it names as its base.
    The head's (and adapter's) random initial weights are drawn from the run seed, so
    they are the same in any process that computes this result: a resumed run, another
    node."""
    import torch

    from stages.models.critic import CRITIC_FILE, make_critic
    from stages.models.lora import settings_of

    out = ctx.output_dir("critic")
    lora = settings_of(policy.local_path())
    if lora is not None:
        lora = {k: v for k, v in lora.items() if k != "base"}
    with torch.random.fork_rng(devices=[]):  # leaves the process's own generator as it was
        torch.manual_seed(ctx.seed)
        critic = make_critic(policy.local_path(), lora)
    critic.save_pretrained(out)
    info = {"version": 0} if lora is None else {"version": 0, "lora": lora, "base": policy.address}
    (out / CRITIC_FILE).write_text(json.dumps(info))
    return StageResult()


def _check_critic(cfg: CriticConfig, pipeline: Neighbours) -> None:
    adv = pipeline.upstream("advantage")
    if adv is not None and not ESTIMATORS.needs(adv.estimator, "critic"):
        raise ConfigProblem(
            "",
            f"the batch comes from advantage.estimator '{adv.estimator}', which uses no "
            "critic: remove the critic nodes or use gae / bi_level_gae",
        )


@stage(
    "critic.update",
    config=CriticConfig,
    outputs={"critic": Artifact("the next critic version")},
    wiring={"critic": "critic@prev"},
    check=_check_critic,
    claims=lambda cfg: trainer_claims("critic.update", cfg.optim, held=False),
    version=2,
    metrics={
        "critic/value_loss": "clipped value loss, 0.5 * squared error, token mean",
        "critic/clipfrac": "fraction of sampled tokens where the value clip won",
        "critic/grad_norm": "critic gradient norm before clipping, mean over optimiser steps",
        "critic/lr": "critic learning rate",
        "critic/tokens": "sampled tokens the critic trained on (0: the batch was empty, the critic is kept)",
        **RESTARTS_METRIC,
    },
)
def update_critic(ctx: StageContext, cfg: CriticConfig, batch: TableRef, critic: ArtifactRef) -> StageResult:
    """The clipped value loss on the batch's returns; the next critic version."""
    from stages.models.batching import per_sample
    from stages.training.fit import check_state_kept, fit, keep_checkpoint
    from stages.training.loops import CriticJob, critic_loop

    check_state_kept(critic, cfg.optim)
    table = per_sample(batch.read(columns=["token_ids", "loss_mask", "values", "returns", "temperature", "segments"]))
    if table.num_rows == 0:
        keep_checkpoint(critic.local_path(), ctx.output_dir("critic"), "critic.json", ctx.key)
        return StageResult(metrics={"critic/tokens": 0.0})
    if table.column("returns").null_count:
        raise ConfigProblem("critic", "the batch has no returns: its advantage estimator uses no critic")
    job = CriticJob(key=ctx.key, seed=ctx.step_seed, cfg=cfg, critic=critic, base=critic_base(critic))
    if cfg.resident and critic_trainer.supports(cfg, job.base):
        return StageResult(metrics=critic_trainer.update(ctx, cfg, job, table, ctx.output_dir("critic")))
    return StageResult(metrics=fit(ctx, critic_loop, job, table, cfg.optim, ctx.output_dir("critic")))
