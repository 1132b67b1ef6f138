"""The Ray Train loops of the actor and the critic (run by `stages.training.fit.fit`).

`actor_loop`: for every mini-batch, the clipped surrogate on the sampled tokens
(ratio against the *stored* sampling log-probabilities), minus the entropy bonus,
plus the optional KL to the frozen reference; AdamW, gradient clipping,
micro-batches with accumulation (docs/method.md#the-update-starpo). `critic_loop`: the
clipped value loss on the batch's returns. Both save the next version as a
checkpoint; the optimiser state travels with it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from catalog.datasets import ArtifactRef
from stages.training.fit import OptimConfig, TrainJob


class ActorSettings(Protocol):
    """What the actor's loop reads of `stages.update.UpdateConfig`."""

    @property
    def optim(self) -> OptimConfig: ...
    @property
    def loss_agg(self) -> Literal["token-mean", "seq-mean-token-mean"]: ...
    @property
    def clip_ratio_low(self) -> float: ...
    @property
    def clip_ratio_high(self) -> float: ...
    @property
    def clip_ratio_c(self) -> float | None: ...
    @property
    def entropy_coef(self) -> float: ...
    @property
    def kl_coef(self) -> float: ...
    @property
    def kl_estimator(self) -> str: ...
    @property
    def correction(self) -> str: ...
    @property
    def is_cap(self) -> float: ...


class CriticSettings(Protocol):
    """What the critic's loop reads of `stages.critic.CriticConfig`."""

    @property
    def optim(self) -> OptimConfig: ...
    @property
    def cliprange_value(self) -> float | None: ...


@dataclass(frozen=True, kw_only=True)
class ActorJob(TrainJob):
    """The actor's update: its settings, the policy it starts from, the reference."""

    cfg: ActorSettings
    policy: ArtifactRef
    reference: ArtifactRef


@dataclass(frozen=True, kw_only=True)
class CriticJob(TrainJob):
    """The critic's update: its settings, the critic, and the policy a LoRA critic sits on."""

    cfg: CriticSettings
    critic: ArtifactRef
    base: ArtifactRef | None = None


def _actor_micro_batch(
    model: Any,
    reference: Callable[[dict[str, Any]], Any] | None,
    b: dict[str, Any],
    cfg: ActorSettings,
    tokens: float,
    rows: float,
    sums: Any,
) -> None:
    """One micro-batch: its share of the mini-batch loss, backward, and its metrics.
    `reference(b)` gives the reference policy's log-probabilities (KL term)."""
    import torch

    from stages.models.forward import sampled_logprobs
    from stages.rl import losses

    mask = b["loss_mask"]
    n = float(mask.sum())

    def own(x: torch.Tensor) -> float:  # the micro-batch's own mean, for the metrics
        return float(losses.aggregate(x.detach(), mask, cfg.loss_agg, n, float(mask.shape[0])))

    from stages.training.fit import autocast

    with autocast(cfg.optim, b["token_ids"].device):  # float32 log-probs out either way (`sampled_logprobs`)
        logp, entropy = sampled_logprobs(model, b["token_ids"], b["attention"], mask, b["temperature"])
    decoupled = "prox_logprobs" in b  # the ratio against the proximal policy, weighted back to the behaviour's
    old = b["prox_logprobs"] if decoupled else b["logprobs"]
    terms = losses.ppo_policy_loss(
        logp, old, b["advantages"], cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c
    )
    policy_terms = terms.loss
    if decoupled:
        weight = losses.behaviour_weight(b["prox_logprobs"], b["logprobs"], cfg.is_cap)
        policy_terms = weight * terms.loss
        sums.add("actor/is_weight", own(weight), n)
    loss = losses.aggregate(policy_terms - cfg.entropy_coef * entropy, mask, cfg.loss_agg, tokens, rows)
    if reference is not None:
        with torch.no_grad(), autocast(cfg.optim, b["token_ids"].device):
            ref_logp = reference(b)
        kl = losses.KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)
        loss = loss + cfg.kl_coef * losses.aggregate(kl, mask, cfg.loss_agg, tokens, rows)
        sums.add("actor/kl_ref", own(kl), n)
    loss.backward()
    sums.add("actor/pg_loss", own(terms.loss), n)
    sums.add("actor/entropy", own(entropy), n)
    for name, hit in (
        ("clipfrac_low", terms.clipped_low),
        ("clipfrac_high", terms.clipped_high),
        ("dual_clipfrac", terms.dual_clipped),
    ):
        sums.add(f"actor/{name}", float(losses.masked_mean(hit.float(), mask)), n)
    sums.add("actor/approx_kl", float(losses.masked_mean(terms.approx_kl.detach(), mask)), n)


def logp_of(model: Any) -> Callable[[dict[str, Any]], Any]:
    """A batch's sampled tokens' log-probabilities under `model`."""
    from stages.models.forward import sampled_logprobs

    return lambda b: sampled_logprobs(model, b["token_ids"], b["attention"], b["loss_mask"], b["temperature"])[0]


class KLReference:
    """An update's KL reference model, loaded once per stored version and kept by its
    holder (a resident trainer, a group member, one fit)."""

    def __init__(self) -> None:
        self.address: str | None = None
        self.model: Any = None

    def logprobs(
        self, cfg: ActorSettings, reference: ArtifactRef, device: str
    ) -> Callable[[dict[str, Any]], Any] | None:
        """The reference's log-probabilities (None without a KL term: nothing is loaded)."""
        from stages.models.policy import load_model

        if cfg.kl_coef <= 0:
            return None
        if self.address != reference.address:
            self.model = load_model(reference.local_path(), device=device, dtype="float32").eval()
            self.address = reference.address
        return logp_of(self.model)


def _actor(
    job: ActorJob, dev: Any
) -> tuple[Any, Any, Callable[[dict[str, Any]], Any] | None, Callable[[Any, Path, int], None]]:
    """(model to train, tokenizer, the reference's log-probabilities or None, how to
    save a trained model as the next version): the whole policy, or a LoRA adapter on
    the frozen reference (`stages.models.lora`)."""
    from stages.models import lora as adapters
    from stages.models.policy import load_policy, save_policy

    cfg, policy, reference = job.cfg, job.policy, job.reference
    policy_dir = policy.local_path()
    settings = adapters.settings_of(policy_dir)
    if settings is None:
        model, tokenizer = load_policy(policy_dir, device=str(dev), dtype="float32")

        def save_full(trained: Any, out: Path, version: int) -> None:
            save_policy(trained, tokenizer, out, version=version, parent=job.key)

        return model, tokenizer, KLReference().logprobs(cfg, reference, str(dev)), save_full
    base_key = settings.get("base", policy.key)  # version 0 is the base itself
    if base_key != reference.key:
        raise ValueError(
            f"update: the LoRA adapter sits on {base_key}, but the reference input is {reference.key}: "
            "with model.lora the reference must be the adapter's base (policy@once)"
        )
    base, tokenizer = load_policy(reference.local_path(), device=str(dev), dtype="float32")
    model = adapters.attach(base, policy_dir, settings)
    forward = logp_of(model)

    def base_logp(b: dict[str, Any]) -> Any:
        with adapters.disabled(model):
            return forward(b)

    def save_adapter(trained: Any, out: Path, version: int) -> None:
        merged = adapters.save_adapter(trained, out)
        save_policy(merged, tokenizer, out, version=version, lora={**settings, "base": reference.key}, parent=job.key)

    return model, tokenizer, (base_logp if cfg.kl_coef > 0 else None), save_adapter


def weights_digest(model: Any) -> str:
    """SHA-256 over the model's tensors (names, dtypes, shapes and bytes, by name)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def proximal_logprobs(table: Any, model: Any, micro: int) -> Any:
    """`table` with ``prox_logprobs``: the log-probs of `model` (the policy being
    updated, before this update) at each sampled token, recomputed for the samples with
    staleness > 0 and the sampling log-probs elsewhere (there the proximal policy is the
    one that sampled)."""
    import numpy as np
    import pyarrow as pa
    import torch

    from stages.models.batching import lengths, padded
    from stages.models.forward import sampled_logprobs

    stale = np.array([(s or 0) > 0 for s in table.column("staleness").to_pylist()])
    prox = table.column("logprobs").to_pylist()
    rows = np.flatnonzero(stale)
    if len(rows):
        was = model.training
        model.eval()
        sizes = lengths(table)
        with torch.no_grad():
            for start in range(0, len(rows), micro):
                part = rows[start : start + micro]
                b = padded(table, part, {"token_ids": torch.long, "loss_mask": torch.long})
                temps = torch.tensor([table.column("temperature")[int(r)].as_py() for r in part], dtype=torch.float32)
                dev = next(model.parameters()).device  # the batch goes where the model is (a GPU's)
                on = {k: b[k].to(dev) for k in ("token_ids", "attention", "loss_mask")}
                logp, _ = sampled_logprobs(model, on["token_ids"], on["attention"], on["loss_mask"], temps.to(dev))
                logp = (logp * on["loss_mask"]).cpu()
                for i, r in enumerate(part):
                    prox[r] = logp[i, : sizes[r]].tolist()
        model.train(was)
    return table.append_column("prox_logprobs", pa.array(prox, pa.list_(pa.float32())))


def continued(model: Any, opt: Any, cfg: ActorSettings, table: Any) -> tuple[Any, Any]:
    """What a trainer that outlives its updates does before each one (`resident`,
    `group`): the optimiser with the spec's settings (as a loaded one gets them; a fresh
    one without `keep_optimizer`), and the batch with its proximal log-probabilities
    under ``correction: decoupled``."""
    from stages.training import fit as train

    if not cfg.optim.keep_optimizer:
        opt = train.optimizer(model, cfg.optim, Path(tempfile.gettempdir()) / "no-optimizer-state")
    for group in opt.param_groups:
        group.update(lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay)
    if cfg.correction == "decoupled":
        table = proximal_logprobs(table, model, cfg.optim.micro_batch_size)
    return opt, table


def actor_steps(
    model: Any,
    opt: Any,
    reference: Callable[[dict[str, Any]], Any] | None,
    table: Any,
    cfg: ActorSettings,
    job: TrainJob,
    dev: Any,
) -> dict[str, float]:
    """PPO on `model` over `table` (this worker's rows), stepping `opt`: every epoch's
    mini-batches, seeded by the job; the metrics. The one body of `actor_loop` and of
    the run's resident trainer (`stages.training.resident`), so both train alike."""
    import torch

    from stages.training import fit as train
    from stages.training import worker

    model.train()
    train.prepare(model, cfg.optim)
    torch.manual_seed(job.seed)
    sums = worker.Sums()
    extra = {"logprobs": torch.float32, "advantages": torch.float32}
    if "prox_logprobs" in table.column_names:
        extra["prox_logprobs"] = torch.float32
    for micros, tokens, rows in worker.batches(table, cfg.optim, job, extra, dev):
        for b in micros:
            _actor_micro_batch(model, reference, b, cfg, tokens, rows, sums)
        sums.add("actor/grad_norm", train.step(model, opt, cfg.optim.grad_clip))
    return sums.means() | {"actor/lr": cfg.optim.lr, "actor/tokens": worker.sampled_tokens(table)}


def actor_loop(config: dict[str, Any]) -> None:
    """The actor's Ray Train loop (``config["job"]``: an `ActorJob`): PPO on the policy
    (module docstring)."""
    import torch

    from stages.models.policy import policy_version
    from stages.training import fit as train
    from stages.training import sharding, worker

    job: ActorJob = config["job"]
    cfg = job.cfg
    table = worker.shard()
    dev = worker.device()
    policy_dir = job.policy.local_path()
    torch.manual_seed(job.seed)  # a new LoRA adapter's initial weights: the same on every worker and every run
    model, _, reference, save = _actor(job, dev)
    model = sharding.distribute(model, cfg.optim)
    opt = train.optimizer(model, cfg.optim, policy_dir)
    metrics = actor_steps(model, opt, reference, table, cfg, job, dev)
    version = policy_version(policy_dir) + 1
    weights, opt_state = sharding.gather(model, opt, cfg.optim)

    def save_version(out: Path) -> None:  # a sharded model is saved from an unsharded copy of its full weights
        save(model if weights is None else sharding.unsharded(lambda: _actor(job, "cpu")[0], weights), out, version)

    train.report(metrics, save_version, opt_state, cfg.optim, job.scratch)


def critic_steps(critic: Any, opt: Any, table: Any, cfg: CriticSettings, job: TrainJob, dev: Any) -> dict[str, float]:
    """The clipped value loss on `critic` over `table` (this worker's rows), stepping
    `opt`: every epoch's mini-batches, seeded by the job; the metrics. The one body of
    `critic_loop` and of the critic kept in this process (`stages.training.critic`)."""
    import torch

    from stages.models.forward import values
    from stages.rl import losses
    from stages.training import fit as train
    from stages.training import worker

    critic.train()
    train.prepare(critic, cfg.optim)
    torch.manual_seed(job.seed)
    sums = worker.Sums()
    extra = {"values": torch.float32, "returns": torch.float32}
    for micros, tokens, rows in worker.batches(table, cfg.optim, job, extra, dev):
        for b in micros:
            mask = b["loss_mask"]
            with train.autocast(cfg.optim, b["token_ids"].device):
                v = values(critic, b["token_ids"], b["attention"])  # float32 values out (`forward.values`)
            per_token, clipped = losses.value_loss(v, b["values"], b["returns"], cfg.cliprange_value)
            loss = losses.aggregate(per_token, mask, "token-mean", tokens, rows)
            loss.backward()
            n = float(mask.sum())
            sums.add("critic/value_loss", float(loss.detach()) * tokens / max(n, 1.0), n)
            sums.add("critic/clipfrac", float(losses.masked_mean(clipped.float(), mask)), n)
        sums.add("critic/grad_norm", train.step(critic, opt, cfg.optim.grad_clip))
    return sums.means() | {"critic/lr": cfg.optim.lr, "critic/tokens": worker.sampled_tokens(table)}


def save_critic(critic: Any, info: dict[str, Any], key: str, out: Path) -> dict[str, Any]:
    """Save the critic trained from the version `info` describes (its ``critic.json``) as
    the next version, made by the update `key`; that version's info."""
    from stages.models.critic import CRITIC_FILE

    critic.save_pretrained(out)  # with LoRA: the adapter and the head only
    saved = {**info, "version": info["version"] + 1, "parent": key}
    (out / CRITIC_FILE).write_text(json.dumps(saved))
    return saved


def critic_loop(config: dict[str, Any]) -> None:
    """The critic's Ray Train loop (``config["job"]``: a `CriticJob`): the clipped value
    loss (module docstring)."""
    from stages.models.critic import critic_info, load_critic
    from stages.training import fit as train
    from stages.training import sharding, worker

    job: CriticJob = config["job"]
    cfg = job.cfg
    table = worker.shard()
    dev = worker.device()
    critic_dir = job.critic.local_path()
    base = job.base
    base_dir = base.local_path() if base is not None else None
    critic = sharding.distribute(load_critic(critic_dir, dev, base_dir, trainable=True), cfg.optim)
    opt = train.optimizer(critic, cfg.optim, critic_dir)
    metrics = critic_steps(critic, opt, table, cfg, job, dev)
    info = critic_info(critic_dir)
    weights, opt_state = sharding.gather(critic, opt, cfg.optim)

    def save(out: Path) -> None:
        trained = critic
        if weights is not None:  # sharded: an unsharded copy of its full weights
            trained = sharding.unsharded(lambda: load_critic(critic_dir, "cpu", base_dir, trainable=True), weights)
        save_critic(trained, info, job.key, out)

    train.report(metrics, save, opt_state, cfg.optim, job.scratch)
