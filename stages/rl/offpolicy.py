"""Off-policy scoring: another policy's expected success and score estimated from stored
trajectories, without playing them (docs/method.md#scoring-a-policy-off-policy).

Every stored turn keeps the log-probability its sampling policy (the *behaviour*)
gave to each sampled token. Under a *target* policy the same turn has another
log-probability; their difference summed over the turn's tokens is the turn's log
importance ratio. The estimate is per-decision weighted importance sampling
(PDWIS): with ``rho[i, t]`` the product of trajectory i's ratios up to turn t (a
finished trajectory keeps its last product: the episode has ended under both
policies),

    V = sum_t  sum_i rho[i, t] r[i, t] / sum_i rho[i, t]

for the per-turn rewards r (the score) and for the success indicator at the turn
where it is earned. Normalising each turn's weights trades a small bias for far less
variance than plain importance sampling. The effective sample size of the
whole-trajectory weights, (sum w)^2 / sum w^2, says how many of the stored episodes
the estimate really rests on; the interval is a bootstrap over trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: below this effective sample size an estimate is reported with a warning
MIN_ESS = 30.0


@dataclass(frozen=True)
class Estimate:
    success: float
    success_ci: tuple[float, float]
    score: float
    score_ci: tuple[float, float]
    ess: float
    episodes: int

    @property
    def trusted(self) -> bool:
        return self.ess >= MIN_ESS


def _grid(rows: Sequence[Sequence[float]]) -> np.ndarray:
    """Ragged per-turn rows as a [N, T] array, padded with 0."""
    out = np.zeros((len(rows), max(max((len(r) for r in rows), default=0), 1)))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def pdwis(log_rho: np.ndarray, rewards: np.ndarray) -> float:
    """PDWIS of per-turn rewards [N, T] with cumulative log ratios [N, T]."""
    w = np.exp(log_rho - log_rho.max(axis=0, keepdims=True))
    return float(((w * rewards).sum(axis=0) / w.sum(axis=0)).sum())


def estimate(
    turn_log_ratios: Sequence[Sequence[float]],
    turn_rewards: Sequence[Sequence[float]],
    success: Sequence[bool],
    boot: int = 1000,
    seed: int = 0,
) -> Estimate:
    """The target policy's success and score from N stored trajectories: per turn, the
    log ratio log pi_target - log pi_behaviour of the turn's sampled tokens, and the
    turn's reward; `success` is earned at the last turn."""
    n = len(success)
    if n == 0 or len(turn_log_ratios) != n or len(turn_rewards) != n:
        raise ValueError("expected one row of turn log ratios and of rewards per trajectory")
    log_rho = np.cumsum(_grid(turn_log_ratios), axis=1)  # constant after a trajectory's end
    rewards = _grid(turn_rewards)
    won = np.zeros_like(rewards)
    for i, (r, s) in enumerate(zip(turn_rewards, success)):
        won[i, max(len(r), 1) - 1] = float(s)
    whole = log_rho[:, -1]
    w = np.exp(whole - whole.max())
    ess = float(w.sum() ** 2 / (w**2).sum())
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(boot, n))
    boot_success = np.array([pdwis(log_rho[d], won[d]) for d in draws])
    boot_score = np.array([pdwis(log_rho[d], rewards[d]) for d in draws])

    def ci(x: np.ndarray) -> tuple[float, float]:
        return float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))

    return Estimate(
        success=pdwis(log_rho, won),
        success_ci=ci(boot_success),
        score=pdwis(log_rho, rewards),
        score_ci=ci(boot_score),
        ess=ess,
        episodes=n,
    )


def turn_sums(values: Sequence[float], mask: Sequence[int]) -> list[float]:
    """`values` summed over each maximal run of the mask (one run per turn's response)."""
    out: list[float] = []
    inside = False
    for v, m in zip(values, mask):
        if m:
            if not inside:
                out.append(0.0)
            out[-1] += float(v)
        inside = bool(m)
    return out
