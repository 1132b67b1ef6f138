"""Reward normalisation and advantage estimators (SPEC §4), as pure tensor functions.

Shapes: ``scores`` [B] (one per trajectory), ``groups`` [B] (group id of each),
``mask`` [B, T] (1 on sampled tokens), ``rewards`` / ``values`` [B, T] (token
level; a trajectory's score sits on its last sampled token).
"""

from __future__ import annotations

from typing import Callable

import torch

EPS = 1e-6


def _per_group(x: torch.Tensor, groups: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    out = torch.empty_like(x)
    for g in torch.unique(groups):
        sel = groups == g
        out[sel] = fn(x[sel])
    return out


def _mean_std(x: torch.Tensor) -> torch.Tensor:
    std = x.std(unbiased=False)
    return torch.zeros_like(x) if std < EPS else (x - x.mean()) / (std + EPS)


METHODS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "mean": lambda x: x - x.mean(),
    "mean_std": _mean_std,
    "asym_clip": lambda x: _mean_std(x).clamp(-1.0, 3.0),
}


def normalize_scores(scores: torch.Tensor, groups: torch.Tensor, grouping: str, method: str) -> torch.Tensor:
    """Normalise trajectory scores per group (`state`), over the batch (`batch`) or
    not at all (`none`), with `method` from `METHODS`."""
    fn = METHODS[method]
    if grouping == "none":
        return scores.clone()
    if grouping == "batch":
        return fn(scores)
    return _per_group(scores, groups, fn)


def last_token(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last sampled token."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the masked entries; zero elsewhere."""
    m = mask.bool()
    mean = x[m].mean()
    std = x[m].std(unbiased=False)
    return torch.where(m, (x - mean) / (std + EPS), torch.zeros_like(x))


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the sampled tokens of each row (tokens
    off the mask are skipped: the next sampled token is the next step). Returns
    (advantages whitened over the mask, returns = raw advantages + values)."""
    adv = torch.zeros_like(rewards)
    B, T = rewards.shape
    for b in range(B):
        running, next_value = 0.0, 0.0
        for t in range(T - 1, -1, -1):
            if not mask[b, t]:
                continue
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            running = delta + gamma * lam * running
            adv[b, t] = running
            next_value = values[b, t]
    returns = (adv + values) * mask
    return whiten(adv, mask), returns


def grpo(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Group-normalised score ((x - mean) / (std + eps) per group), broadcast over
    each trajectory's sampled tokens."""
    return normalize_scores(scores, groups, "state", "mean_std")[:, None] * mask


def rloo(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: score minus the mean of the *other* group members
    (0 for a group of one), broadcast over the sampled tokens."""
    def loo(x: torch.Tensor) -> torch.Tensor:
        n = len(x)
        return torch.zeros_like(x) if n < 2 else x - (x.sum() - x) / (n - 1)

    return _per_group(scores, groups, loo)[:, None] * mask
