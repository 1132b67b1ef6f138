"""The update (SPEC §4): PPO on the actor, the value loss on the critic.

`update` trains the policy on the advantage batch: for every mini-batch,
the clipped surrogate on the sampled tokens (ratio against the *stored* sampling
log-probabilities), minus the entropy bonus, plus the optional KL to the frozen
reference (the warm-started policy); AdamW, gradient clipping, micro-batches with
accumulation. `critic.update` trains the value head on the batch's returns with
the clipped value loss. Both run their loop under Ray Train (`stages.train`) and
save the next version as a checkpoint; the optimiser state travels with it.

`critic.init` makes the first critic: a value head on a copy of the policy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from catalog.datasets import Artifact, ArtifactRef, TableRef
from stages.config import ConfigProblem, param
from stages.registry import Neighbours, StageContext, StageResult, stage
from stages.train import OptimConfig

ACTOR_OPTIM = OptimConfig(lr=1e-4)


@dataclass(frozen=True)
class UpdateConfig:
    """`update:` — the PPO actor update."""

    optim: OptimConfig = param(ACTOR_OPTIM, "optimiser, batch sizes, epochs and Ray Train workers "
                                            "(paper: lr 1e-6 for a 0.5B model)")
    clip_ratio_low: float = param(0.2, "ratio clip below: 1 - clip_ratio_low (SPEC: 0.2)", ge=0, le=1)
    clip_ratio_high: float = param(0.28, "ratio clip above: 1 + clip_ratio_high (StarPO-S: 0.28, "
                                         "vanilla: 0.2)", ge=0)
    clip_ratio_c: float | None = param(3.0, "dual clip: a negative advantage's loss is at most "
                                            "-adv * clip_ratio_c (None: off; SPEC: 3.0)", gt=1)
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = param("token-mean", "how token losses are averaged")
    entropy_coef: float = param(0.001, "entropy bonus coefficient (SPEC: 0.001)", ge=0)
    kl_coef: float = param(0.0, "KL-to-reference loss coefficient (StarPO-S: 0; vanilla: 0.001)", ge=0)
    kl_estimator: Literal["k1", "k3"] = param("k3", "KL estimator: k1 (log-ratio) or k3 (low-variance)")


@dataclass(frozen=True)
class CriticConfig:
    """`critic:` — the value-head update."""

    optim: OptimConfig = param(OptimConfig(lr=1e-3), "optimiser of the critic (SPEC: 10x the actor's lr)")
    cliprange_value: float | None = param(0.5, "clip of the value change against the batch's values "
                                               "(None: off; SPEC: 0.5)", gt=0)


@dataclass(frozen=True)
class CriticInitConfig:
    """`critic.init:` — nothing to set: the value head sits on a copy of the policy."""


def _actor_micro_batch(model: Any, ref: Any, b: dict[str, Any], cfg: UpdateConfig, tokens: float, rows: float,
                       sums: Any) -> None:
    """One micro-batch: its share of the mini-batch loss, backward, and its metrics."""
    import torch

    from stages import losses
    from stages.models import sampled_logprobs

    mask = b["loss_mask"]
    n = float(mask.sum())

    def own(x: torch.Tensor) -> float:  # the micro-batch's own mean, for the metrics
        return float(losses.aggregate(x.detach(), mask, cfg.loss_agg, n, float(mask.shape[0])))

    logp, entropy = sampled_logprobs(model, b["token_ids"], b["attention"], mask, b["temperature"])
    terms = losses.ppo_policy_loss(logp, b["logprobs"], b["advantages"], cfg.clip_ratio_low,
                                   cfg.clip_ratio_high, cfg.clip_ratio_c)
    loss = losses.aggregate(terms.loss - cfg.entropy_coef * entropy, mask, cfg.loss_agg, tokens, rows)
    if ref is not None:
        with torch.no_grad():
            ref_logp, _ = sampled_logprobs(ref, b["token_ids"], b["attention"], mask, b["temperature"])
        kl = losses.KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)
        loss = loss + cfg.kl_coef * losses.aggregate(kl, mask, cfg.loss_agg, tokens, rows)
        sums.add("actor/kl_ref", own(kl), n)
    loss.backward()
    sums.add("actor/pg_loss", own(terms.loss), n)
    sums.add("actor/entropy", own(entropy), n)
    for name, hit in (("clipfrac_low", terms.clipped_low), ("clipfrac_high", terms.clipped_high),
                      ("dual_clipfrac", terms.dual_clipped)):
        sums.add(f"actor/{name}", float(losses.masked_mean(hit.float(), mask)), n)
    sums.add("actor/approx_kl", float(losses.masked_mean(terms.approx_kl.detach(), mask)), n)


def actor_loop(config: dict[str, Any]) -> None:
    """The actor's Ray Train loop (module docstring)."""
    import torch

    from stages import train
    from stages.policy import load_policy, policy_version, save_policy

    cfg: UpdateConfig = config["cfg"]
    table = train.shard()
    dev = train.device()
    policy_dir = config["policy"].local_path()
    model, tokenizer = load_policy(policy_dir, device=str(dev), dtype="float32")
    model.train()
    ref = None
    if cfg.kl_coef > 0:
        ref = load_policy(config["reference"].local_path(), device=str(dev), dtype="float32")[0].eval()
    opt = train.optimizer(model, cfg.optim, policy_dir)
    torch.manual_seed(config["seed"])
    sums = train.Sums()
    extra = {"logprobs": torch.float32, "advantages": torch.float32}
    for micros, tokens, rows in train.batches(table, cfg.optim, config, extra, dev):
        for b in micros:
            _actor_micro_batch(model, ref, b, cfg, tokens, rows, sums)
        sums.add("actor/grad_norm", train.step(model, opt, cfg.optim.grad_clip))
    metrics = sums.means() | {"actor/lr": cfg.optim.lr, "actor/tokens": train.sampled_tokens(table)}
    version = policy_version(policy_dir) + 1
    train.report(metrics, lambda out: save_policy(model, tokenizer, out, version=version, parent=config["key"]),
                 opt, cfg.optim)


def critic_loop(config: dict[str, Any]) -> None:
    """The critic's Ray Train loop (module docstring)."""
    import torch

    from stages import losses, train
    from stages.models import load_critic, values

    cfg: CriticConfig = config["cfg"]
    table = train.shard()
    dev = train.device()
    critic_dir = config["critic"].local_path()
    critic = load_critic(critic_dir, dev)
    critic.train()
    opt = train.optimizer(critic, cfg.optim, critic_dir)
    torch.manual_seed(config["seed"])
    sums = train.Sums()
    extra = {"values": torch.float32, "returns": torch.float32}
    for micros, tokens, rows in train.batches(table, cfg.optim, config, extra, dev):
        for b in micros:
            mask = b["loss_mask"]
            v = values(critic, b["token_ids"], b["attention"])
            per_token, clipped = losses.value_loss(v, b["values"], b["returns"], cfg.cliprange_value)
            loss = losses.aggregate(per_token, mask, "token-mean", tokens, rows)
            loss.backward()
            n = float(mask.sum())
            sums.add("critic/value_loss", float(loss.detach()) * tokens / max(n, 1.0), n)
            sums.add("critic/clipfrac", float(losses.masked_mean(clipped.float(), mask)), n)
        sums.add("critic/grad_norm", train.step(critic, opt, cfg.optim.grad_clip))
    version = json.loads((critic_dir / "critic.json").read_text())["version"] + 1

    def save(out: Path) -> None:
        critic.save_pretrained(out)
        (out / "critic.json").write_text(json.dumps({"version": version, "parent": config["key"]}))

    metrics = sums.means() | {"critic/lr": cfg.optim.lr, "critic/tokens": train.sampled_tokens(table)}
    train.report(metrics, save, opt, cfg.optim)


def _unchanged(source: Path, out: Path, info: str, metric: str, key: str) -> StageResult:
    """An empty batch (the filter kept no group): the next version is the same
    weights (and optimiser state) under the next version number."""
    import shutil

    shutil.copytree(source, out, dirs_exist_ok=True)
    meta = json.loads((out / info).read_text())
    (out / info).write_text(json.dumps({**meta, "version": meta["version"] + 1, "parent": key}, indent=1,
                                       sort_keys=True))
    return StageResult(metrics={metric: 0.0})


@stage("update", config=UpdateConfig, outputs={"policy": Artifact("the next policy version")},
       wiring={"policy": "policy@prev", "reference": "policy@once"}, version=2,
       metrics={"actor/pg_loss": "PPO clipped surrogate loss (aggregated as loss_agg)",
                "actor/entropy": "mean entropy of the policy at the sampled tokens",
                "actor/clipfrac_low": "fraction of sampled tokens where the lower ratio clip binds (adv < 0)",
                "actor/clipfrac_high": "fraction of sampled tokens where the upper ratio clip binds (adv > 0)",
                "actor/dual_clipfrac": "fraction of sampled tokens where the dual clip binds",
                "actor/approx_kl": "mean of old_logp - logp over sampled tokens (k1 KL(old || new))",
                "actor/kl_ref": "KL to the reference policy (only with kl_coef > 0)",
                "actor/grad_norm": "actor gradient norm before clipping, mean over optimiser steps",
                "actor/lr": "actor learning rate",
                "actor/tokens": "sampled tokens trained on (0: the batch was empty, the policy is kept)"})
def update(ctx: StageContext, cfg: UpdateConfig, batch: TableRef, policy: ArtifactRef, reference: ArtifactRef
           ) -> StageResult:
    """PPO on the actor over the advantage batch; the next policy version."""
    from stages.train import fit

    from stages.train import per_sample

    table = per_sample(batch.read(columns=["token_ids", "loss_mask", "logprobs", "advantages", "temperature",
                                            "segments"]))
    if table.num_rows == 0:
        return _unchanged(policy.local_path(), ctx.output_dir("policy"), "policy.json", "actor/tokens", ctx.key)
    config = {"cfg": cfg, "policy": policy, "reference": reference, "key": ctx.key,
              "seed": ctx.seed * 1_000_003 + (ctx.iteration or 0)}
    metrics = fit(ctx, actor_loop, config, table, cfg.optim, ctx.output_dir("policy"))
    return StageResult(metrics=metrics)


@stage("critic.init", config=CriticInitConfig, outputs={"critic": Artifact("the first critic")},
       wiring={"policy": "policy"})
def init_critic(ctx: StageContext, cfg: CriticInitConfig, policy: ArtifactRef) -> StageResult:
    """A value head on a copy of the (warm-started) policy: critic version 0."""
    from stages.models import make_critic

    out = ctx.output_dir("critic")
    make_critic(policy.local_path()).save_pretrained(out)
    (out / "critic.json").write_text(json.dumps({"version": 0}))
    return StageResult()


def _check_critic(cfg: CriticConfig, pipeline: Neighbours) -> None:
    from stages.advantage import needs

    adv = pipeline.upstream("advantage")
    if adv is not None and not needs(adv.estimator, "critic"):
        raise ConfigProblem("", f"the batch comes from advantage.estimator '{adv.estimator}', which uses no "
                                     "critic: remove the critic nodes or use gae / bi_level_gae")


@stage("critic.update", config=CriticConfig, outputs={"critic": Artifact("the next critic version")},
       wiring={"critic": "critic@prev"}, check=_check_critic, version=2,
       metrics={"critic/value_loss": "clipped value loss, 0.5 * squared error, token mean",
                "critic/clipfrac": "fraction of sampled tokens where the value clip won",
                "critic/grad_norm": "critic gradient norm before clipping, mean over optimiser steps",
                "critic/lr": "critic learning rate",
                "critic/tokens": "sampled tokens the critic trained on (0: the batch was empty, the critic is kept)"})
def update_critic(ctx: StageContext, cfg: CriticConfig, batch: TableRef, critic: ArtifactRef) -> StageResult:
    """The clipped value loss on the batch's returns; the next critic version."""
    from stages.train import fit

    from stages.train import per_sample

    table = per_sample(batch.read(columns=["token_ids", "loss_mask", "values", "returns", "temperature", "segments"]))
    if table.num_rows == 0:
        return _unchanged(critic.local_path(), ctx.output_dir("critic"), "critic.json", "critic/tokens", ctx.key)
    if table.column("returns").null_count:
        raise ConfigProblem("critic", "the batch has no returns: its advantage estimator uses no critic")
    config = {"cfg": cfg, "critic": critic, "key": ctx.key, "seed": ctx.seed * 1_000_003 + (ctx.iteration or 0)}
    return StageResult(metrics=fit(ctx, critic_loop, config, table, cfg.optim, ctx.output_dir("critic")))

