import numpy as np
import pytest

from stages.rl.registry import STRATEGIES
from stages.rl.uncertainty import group_stds

# four groups of two: raw-score stds 0.5, 0, 2, 1
SCORES = np.array([1.0, 2.0, 3.0, 3.0, -1.0, 3.0, 0.0, 2.0])
GROUPS = np.array([0, 0, 1, 1, 2, 2, 3, 3])


def test_std_is_taken_over_raw_scores():
    ids, stds = group_stds(SCORES, GROUPS)
    assert ids.tolist() == [0, 1, 2, 3] and stds.tolist() == [0.5, 0.0, 2.0, 1.0]


@pytest.mark.parametrize(
    "strategy, ratio, kept",
    [
        ("top_k", 0.25, [2]),  # ceil(0.25 * 4) = 1 group, the highest std
        ("top_k", 0.5, [2, 3]),
        ("top_k", 0.01, [2]),  # never fewer than one group
        ("std_rev", 0.5, [0, 1]),  # the two lowest stds
        ("top_p", 0.5, [2]),  # 2.0 of a 3.5 total already reaches 50%
        ("top_p", 0.6, [2, 3]),  # 2.0 < 2.1 <= 3.0
        ("top_p", 1.0, [0, 2, 3]),  # the zero-std group adds no mass
        ("adaptive", 0.5, [2]),  # variances 0.25, 0, 4, 1: 4 of 5.25 reaches 50%
        ("adaptive", 0.8, [2, 3]),  # 4 < 4.2 <= 5
        ("adaptive", 1.0, [0, 2, 3]),  # never the zero-variance group
        ("min_p", 0.5, [2, 3]),  # std >= 0.5 * 2.0
        ("min_p", 0.25, [0, 2, 3]),
        ("none", 0.25, [0, 1, 2, 3]),
    ],
)
def test_strategies_by_hand(strategy, ratio, kept):
    _, stds = group_stds(SCORES, GROUPS)
    assert STRATEGIES[strategy](stds, ratio).tolist() == kept


def test_ties_keep_the_lower_group_and_all_zero_stds_keep_everything_for_top_p():
    stds = np.array([1.0, 1.0, 1.0, 0.0])
    assert STRATEGIES["top_k"](stds, 0.5).tolist() == [0, 1]
    assert STRATEGIES["top_p"](np.zeros(3), 0.5).tolist() == [0, 1, 2]


def test_drop_zero_std_removes_groups_without_signal():
    import pyarrow as pa

    from stages.filter import FilterConfig, keep_groups

    table = pa.table({"score": [1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 0.0, 3.0], "group": [0, 0, 1, 1, 2, 2, 3, 3]})
    kept, m = keep_groups(table, FilterConfig(strategy="top_k", ratio=0.75, drop_zero_std=True))
    assert table.take(kept)["group"].to_pylist() == [0, 0, 3, 3]  # top 3 by std are 3, 0, 1; group 1 has std 0
    assert m["filter/kept_groups"] == 2 and m["filter/zero_std_groups"] == 2
    flat = pa.table({"score": [0.5] * 4, "group": [0, 0, 1, 1]})
    kept, m = keep_groups(flat, FilterConfig(strategy="none", drop_zero_std=True))
    assert len(kept) == 0 and m["filter/kept_groups"] == 0


def test_the_adaptive_filter_keeps_few_groups_when_the_variance_sits_in_few_and_most_when_it_is_spread():
    """The share kept is set by the batch (`filter/kept_share`): 16 groups at the same
    ratio, 0.9 as RAGEN-2 recommends."""
    import pyarrow as pa

    from stages.filter import FilterConfig, keep_groups

    def share(stds: list[float]) -> float:
        scores = [x for s in stds for x in (-s, s)]  # a group of two: std s
        table = pa.table({"score": scores, "group": [g for g in range(len(stds)) for _ in (0, 1)]})
        return keep_groups(table, FilterConfig(strategy="adaptive", ratio=0.9))[1]["filter/kept_share"]

    concentrated = [1.0, 1.0] + [0.1] * 14  # two groups hold 2 / 2.14 of the variance
    spread = [1.0] * 12 + [0.0] * 4  # twelve equal groups, four with nothing to learn
    assert share(concentrated) == 2 / 16
    assert share(spread) == 11 / 16  # 0.9 of 12 equal groups: 11 (10.8 rounded up), none of the 4 flat
    assert share([0.5] * 16) == 15 / 16 and share([0.0] * 16) == 1.0  # nothing to rank: all, as top_p
    # a larger ratio never keeps fewer groups
    stds = np.array([1.0, 0.8, 0.5, 0.5, 0.3, 0.1, 0.0])
    counts = [len(STRATEGIES["adaptive"](stds, r)) for r in (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 6
