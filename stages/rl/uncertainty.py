"""StarPO-S uncertainty filtering (docs/method.md#starpo-s-uncertainty-filtering): keep the groups whose trajectory
scores vary the most.

The standard deviation is taken over each group's *raw* scores: normalising per
group first, as the reference does, would make every std ~1
(docs/method.md#where-we-differ-from-the-reference-and-why). Each strategy
maps the groups' stds and a ratio to the indices of the kept groups; ties keep
the lower group index, so the choice is deterministic.
"""

from __future__ import annotations

import math

import numpy as np


def group_stds(scores: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group ids in ascending order, population std of each group's scores)."""
    ids = np.unique(groups)
    return ids, np.array([scores[groups == g].std() for g in ids], dtype=np.float64)


def _by_std(stds: np.ndarray, descending: bool) -> np.ndarray:
    """Group positions sorted by std (ties: lower position first)."""
    return np.lexsort((np.arange(len(stds)), -stds if descending else stds))


def top_k(stds: np.ndarray, ratio: float) -> np.ndarray:
    """The ceil(ratio * groups) groups with the highest std (RAGEN's default, 0.25)."""
    return np.sort(_by_std(stds, True)[: max(1, math.ceil(ratio * len(stds)))])


def std_rev(stds: np.ndarray, ratio: float) -> np.ndarray:
    """The ceil(ratio * groups) groups with the lowest std (an ablation)."""
    return np.sort(_by_std(stds, False)[: max(1, math.ceil(ratio * len(stds)))])


def _holding(stds: np.ndarray, mass: np.ndarray, ratio: float) -> np.ndarray:
    """The fewest highest-std groups whose `mass` (a per-group weight) reaches `ratio` of
    the total, highest first; all groups, in order, when the total is 0."""
    total = mass.sum()
    if total <= 0:
        return np.arange(len(stds))
    order = _by_std(stds, True)
    n = int(np.searchsorted(np.cumsum(mass[order]), ratio * total - 1e-12)) + 1
    return order[: min(n, len(stds))]


def top_p(stds: np.ndarray, ratio: float) -> np.ndarray:
    """The fewest highest-std groups whose std sum reaches `ratio` of the total
    (all groups when every std is 0)."""
    return np.sort(_holding(stds, stds, ratio))


def adaptive(stds: np.ndarray, ratio: float) -> np.ndarray:
    """The fewest highest-variance groups that hold `ratio` of the batch's in-group
    variance (RAGEN-2's SNR-adaptive filter, which recommends 0.9), never a group whose
    scores are all the same: how many are kept is set by each batch, few when the
    variance sits in a few groups (little signal: train on it alone), most when it is
    spread. All groups when no group has any variance (as `top_p`)."""
    variances = stds**2
    kept = _holding(stds, variances, ratio)
    return np.sort(kept if variances.sum() <= 0 else kept[variances[kept] > 0])


def min_p(stds: np.ndarray, ratio: float) -> np.ndarray:
    """Groups whose std is at least `ratio` times the largest std."""
    return np.flatnonzero(stds >= ratio * stds.max()) if len(stds) else np.arange(0)


def keep_all(stds: np.ndarray, ratio: float) -> np.ndarray:
    """No filtering (vanilla StarPO)."""
    return np.arange(len(stds))
