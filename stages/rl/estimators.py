"""Reward normalisation and advantage estimators (docs/method.md#the-update-starpo), as pure tensor functions.

Shapes: ``scores`` [B] (one per trajectory), ``groups`` [B] (group id of each),
``mask`` [B, T] (1 on sampled tokens), ``rewards`` / ``values`` [B, T] (token
level; a trajectory's score sits on its last sampled token, or with turn-level
rewards each turn's reward on that turn's last sampled token).

Every estimator in `ESTIMATORS` takes an `AdvantageBatch` and returns
(advantages, returns); returns are None for the critic-free estimators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


def mean_centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean()


def mean_std(x: torch.Tensor) -> torch.Tensor:
    return _mean_std(x)


def asym_clip(x: torch.Tensor) -> torch.Tensor:
    return _mean_std(x).clamp(-1.0, 3.0)


def normalize_scores(scores: torch.Tensor, groups: torch.Tensor, grouping: str, method: str) -> torch.Tensor:
    """Normalise trajectory scores per group (`state`), over the batch (`batch`) or
    not at all (`none`), with `method` from `stages.rl.registry.METHODS`."""
    from stages.rl.registry import METHODS

    fn = METHODS[method].load()
    if grouping == "none":
        return scores.clone()
    if grouping == "batch":
        return fn(scores)
    return _per_group(scores, groups, fn)


def last_token(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last sampled token."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def packed(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's sampled positions in order, packed to the left: (index [B, L], on
    [B, L]) with L the most sampled tokens of a row; `on` is False past a row's own
    count, where `index` names its unsampled positions (each position once). A
    recursion over time that skips unsampled tokens runs over L steps instead of T,
    with the same operations on each row's values in the same order."""
    m = mask.bool()
    counts = m.sum(dim=1)
    width = int(counts.max()) if m.numel() else 0
    index = torch.argsort((~m).to(torch.int8), dim=1, stable=True)[:, :width]
    return index, torch.arange(width).expand(m.shape[0], width) < counts[:, None]


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the masked entries; zero elsewhere."""
    m = mask.bool()
    mean = x[m].mean()
    std = x[m].std(unbiased=False)
    return torch.where(m, (x - mean) / (std + EPS), torch.zeros_like(x))


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the sampled tokens of each row (tokens
    off the mask are skipped: the next sampled token is the next step). Returns
    (advantages whitened over the mask, returns = raw advantages + values)."""
    index, on = packed(mask)
    r, v = rewards.gather(1, index), values.gather(1, index)
    packed_adv = torch.zeros_like(r)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    next_value = torch.zeros_like(running)
    for t in range(r.shape[1] - 1, -1, -1):  # over sampled tokens; every row at once
        step = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * running
        running = torch.where(on[:, t], step, running)
        packed_adv[:, t] = torch.where(on[:, t], step, packed_adv[:, t])
        next_value = torch.where(on[:, t], v[:, t], next_value)
    adv = torch.zeros_like(rewards).scatter_(1, index, packed_adv)
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


def reinforce_pp(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++: the discounted return-to-go of the token rewards (over sampled
    tokens only), whitened over the masked tokens of the batch. With group
    normalisation of the scores first it is REINFORCE++ with a group baseline."""
    index, on = packed(mask)
    r = rewards.gather(1, index)
    packed_out = torch.zeros_like(r)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(r.shape[1] - 1, -1, -1):  # over sampled tokens; every row at once
        running = torch.where(on[:, t], r[:, t] + gamma * running, running)
        packed_out[:, t] = torch.where(on[:, t], running, packed_out[:, t])
    return whiten(torch.zeros_like(rewards).scatter_(1, index, packed_out), mask)


def turn_spans(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """(first, last) index of each run of sampled tokens: one run per turn's response."""
    spans: list[tuple[int, int]] = []
    start = None
    for t, m in enumerate([*mask_row.tolist(), 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            spans.append((start, t - 1))
            start = None
    return spans


def token_rewards(
    mask: torch.Tensor, scores: torch.Tensor, normalized: torch.Tensor, turn_rewards: Sequence[Sequence[float]] | None
) -> torch.Tensor:
    """Rewards on tokens: the normalised score on each trajectory's last sampled
    token; or, with `turn_rewards`, each turn's reward on that turn's last token
    plus the normalisation's change of the total (normalized - score) on the last."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for b in range(mask.shape[0]):
        spans = turn_spans(mask[b])
        if not spans:
            continue
        if turn_rewards is None:
            out[b, spans[-1][1]] = normalized[b]
            continue
        for k, r in enumerate(turn_rewards[b]):
            out[b, spans[min(k, len(spans) - 1)][1]] += r
        out[b, spans[-1][1]] += normalized[b] - scores[b]
    return out


def bi_level_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    turn_gamma: float,
    turn_lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE. Turn level: over the turns k with reward r_k (on the turn's
    last token) and value V_k (at its first sampled token),
    delta_k = r_k + turn_gamma * V_{k+1} - V_k, A_k = delta_k + turn_gamma * turn_lam * A_{k+1},
    and the turn's return G_k = A_k + V_k (G after the last turn is 0). Token level,
    inside turn k: a GAE (gamma, lam) over its tokens whose last token is
    bootstrapped from r_k + turn_gamma * G_{k+1}. With all four factors at 1 this
    is `gae` with turn-level rewards. Returns (whitened advantages, returns)."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        spans = turn_spans(mask[b])
        v_start = [float(values[b, s]) for s, _ in spans]
        r = [float(rewards[b, e]) for _, e in spans]
        following = [0.0] * (len(spans) + 1)  # G_{k+1}
        a = 0.0
        for k in range(len(spans) - 1, -1, -1):
            next_v = v_start[k + 1] if k + 1 < len(spans) else 0.0
            a = r[k] + turn_gamma * next_v - v_start[k] + turn_gamma * turn_lam * a
            following[k] = a + v_start[k]
        for k, (s, e) in enumerate(spans):
            running, next_value = 0.0, None
            for t in range(e, s - 1, -1):
                target = r[k] + turn_gamma * following[k + 1] if next_value is None else gamma * next_value
                running = target - float(values[b, t]) + gamma * lam * running
                adv[b, t] = running
                next_value = float(values[b, t])
    returns = (adv + values) * mask
    return whiten(adv, mask), returns


def gigpo(
    scores: torch.Tensor,
    groups: torch.Tensor,
    mask: torch.Tensor,
    states: Sequence[Sequence[str]],
    turn_rewards: Sequence[Sequence[float]],
    gamma: float,
    weight: float,
) -> torch.Tensor:
    """Group-in-group advantages (GiGPO). Episode level: the group-normalised score,
    as `grpo`. Step level: every turn k of a trajectory has an anchor, its group and
    the state it was played from, and a return G_k = sum_{j>=k} gamma^(j-k) r_j of the
    turn rewards; turns sharing an anchor (the same state met in several
    trajectories of a group, or twice in one) are normalised together by mean/std
    (zero where an anchor has one turn or equal returns). A turn's tokens get
    episode + `weight` * step advantage."""
    anchors: dict[tuple[int, str], list[tuple[int, int, float]]] = {}
    spans = [turn_spans(mask[b]) for b in range(mask.shape[0])]
    for b, (turn_states, rewards) in enumerate(zip(states, turn_rewards, strict=True)):
        running, returns = 0.0, []
        for r in reversed(rewards):
            running = r + gamma * running
            returns.append(running)
        for k, (state, g) in enumerate(zip(turn_states, reversed(returns))):
            anchors.setdefault((int(groups[b]), state), []).append((b, k, g))
    out = grpo(scores, groups, mask)
    for members in anchors.values():
        step = _mean_std(torch.tensor([g for _, _, g in members]))
        for (b, k, _), a in zip(members, step.tolist()):
            if k < len(spans[b]):
                s, e = spans[b][k]
                out[b, s : e + 1] += weight * a  # a span holds only sampled tokens
    return out


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator may use: normalised scores, groups, the loss mask, token
    rewards (`token_rewards`), the critic's values (None without a critic), and per
    trajectory the states its turns were played from and the turns' rewards (None
    unless the estimator needs them)."""

    scores: torch.Tensor
    groups: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor | None
    turn_states: Sequence[Sequence[str]] | None = None
    turn_rewards: Sequence[Sequence[float]] | None = None


@dataclass(frozen=True)
class Discount:
    """Discount factors: token-level gamma/lam, turn-level turn_gamma/turn_lam (bi_level_gae;
    gigpo's step returns use turn_gamma), and gigpo's step-advantage weight."""

    gamma: float = 1.0
    lam: float = 1.0
    turn_gamma: float = 0.95
    turn_lam: float = 1.0
    step_weight: float = 1.0


Estimator = Callable[[AdvantageBatch, Discount], tuple[torch.Tensor, torch.Tensor | None]]


def _need_values(batch: AdvantageBatch) -> torch.Tensor:
    if batch.values is None:
        raise ValueError("this estimator needs the critic's values")
    return batch.values


def _need_turns(batch: AdvantageBatch) -> tuple[Sequence[Sequence[str]], Sequence[Sequence[float]]]:
    if batch.turn_states is None or batch.turn_rewards is None:
        raise ValueError("this estimator needs the turns' states and rewards")
    return batch.turn_states, batch.turn_rewards


def estimate_gae(b: AdvantageBatch, d: Discount) -> tuple[torch.Tensor, torch.Tensor | None]:
    return gae(b.rewards, _need_values(b), b.mask, d.gamma, d.lam)


def estimate_bi_level_gae(b: AdvantageBatch, d: Discount) -> tuple[torch.Tensor, torch.Tensor | None]:
    return bi_level_gae(b.rewards, _need_values(b), b.mask, d.gamma, d.lam, d.turn_gamma, d.turn_lam)


def estimate_grpo(b: AdvantageBatch, d: Discount) -> tuple[torch.Tensor, torch.Tensor | None]:
    return grpo(b.scores, b.groups, b.mask), None


def estimate_rloo(b: AdvantageBatch, d: Discount) -> tuple[torch.Tensor, torch.Tensor | None]:
    return rloo(b.scores, b.groups, b.mask), None


def estimate_reinforce_pp(b: AdvantageBatch, d: Discount) -> tuple[torch.Tensor, torch.Tensor | None]:
    return reinforce_pp(b.rewards, b.mask, d.gamma), None


def estimate_gigpo(b: AdvantageBatch, d: Discount) -> tuple[torch.Tensor, torch.Tensor | None]:
    return gigpo(b.scores, b.groups, b.mask, *_need_turns(b), d.turn_gamma, d.step_weight), None
