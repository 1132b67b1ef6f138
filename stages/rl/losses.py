"""The update's losses (docs/method.md#the-update-starpo), as pure tensor functions.

Shapes: ``[B, T]`` per token; ``mask`` is 1 on the tokens the policy sampled.
Token-level values are aligned with the token ids: ``logp[b, t]`` is the
log-probability of ``ids[b, t]`` given ``ids[b, :t]``, as stored by the rollout.

Aggregation: ``token-mean`` averages over every sampled token of the mini-batch;
``seq-mean-token-mean`` averages each trajectory's tokens, then the trajectories.
`total_tokens` / `total_rows` are the mini-batch's counts, so that summing the
losses of its micro-batches gives exactly the mini-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-mean"]


def aggregate(
    x: torch.Tensor, mask: torch.Tensor, mode: Aggregation, total_tokens: float, total_rows: float
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch mean of `x` (see the module docstring)."""
    m = mask.to(x.dtype)
    if mode == "token-mean":
        return (x * m).sum() / max(total_tokens, 1.0)
    per_row = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
    return per_row.sum() / max(total_rows, 1.0)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


@dataclass(frozen=True)
class PolicyLossTerms:
    """Per-token PPO terms: the loss and where each clip was active."""

    loss: torch.Tensor
    clipped_low: torch.Tensor  # ratio < 1 - clip_low on a negative advantage
    clipped_high: torch.Tensor  # ratio > 1 + clip_high on a positive advantage
    dual_clipped: torch.Tensor  # the dual clip bound the loss of a negative advantage
    approx_kl: torch.Tensor  # old_logp - logp (k1 estimate of KL(old || new))


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> PolicyLossTerms:
    """PPO's clipped surrogate with decoupled bounds [1 - clip_low, 1 + clip_high]
    and, for negative advantages, the dual clip: the loss is at most -adv * clip_c."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if clip_c is not None:
        bound = -adv * clip_c
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return PolicyLossTerms(
        loss=loss,
        clipped_low=(adv < 0) & (ratio < 1.0 - clip_low),
        clipped_high=(adv > 0) & (ratio > 1.0 + clip_high),
        dual_clipped=dual,
        approx_kl=-log_ratio,
    )


def behaviour_weight(prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """The decoupled objective's per-token importance weight (AReaL; verl's truncated
    importance sampling): pi_prox / pi_behaviour at the sampled token, truncated at
    `cap`, without gradient. With the proximal policy the one that sampled (no
    staleness) it is 1 everywhere, and the decoupled loss is PPO's."""
    return torch.exp((prox_logp - behaviour_logp).clamp(-20.0, 20.0)).clamp(max=cap).detach()


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 estimate of KL(policy || reference) per sampled token: logp - ref_logp."""
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 ("low-var") estimate: exp(ref - logp) - (ref - logp) - 1 >= 0, clamped at 10."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(max=10.0)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": kl_k1, "k3": kl_k3}


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss 0.5 * max((v - R)^2, (v_clip - R)^2), with
    v_clip = old + clamp(v - old, -clip, clip); and where the clipped term won."""
    plain = (values - returns) ** 2
    if clip is None:
        return 0.5 * plain, torch.zeros_like(plain, dtype=torch.bool)
    clipped_v = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_v - returns) ** 2
    return 0.5 * torch.maximum(plain, clipped), clipped > plain


def token_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor | float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``ids[:, 1:]`` under ``logits[:, :-1] / temperature``,
    and the entropies of those distributions, both shaped like `ids` (position 0
    is 0: the first token has no prediction)."""
    t = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device)
    if t.dim() == 1:
        t = t[:, None, None]
    logp_all = torch.log_softmax(logits[:, :-1].float() / t, dim=-1)
    picked = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    pad = torch.zeros_like(ids[:, :1], dtype=picked.dtype)
    return torch.cat([pad, picked], dim=1), torch.cat([pad, entropy], dim=1)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1 = perfect)."""
    m = mask.bool()
    var = returns[m].var(unbiased=False)
    if var <= 0:
        return 0.0
    return float(1.0 - (returns[m] - values[m]).var(unbiased=False) / var)
