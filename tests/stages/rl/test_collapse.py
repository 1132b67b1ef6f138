"""The collapse indicators, against counts done by hand."""

import pyarrow as pa
import pytest

from stages.rl.collapse import collapse_metrics, distinct_n, duplicate_rate, top_share


def test_distinct_n_counts_unique_ngrams_over_all_responses():
    assert distinct_n([[1, 2, 1, 2], [1, 2]], 1) == pytest.approx(2 / 6)
    assert distinct_n([[1, 2, 1, 2], [1, 2]], 2) == pytest.approx(2 / 4)  # (1,2) (2,1) | 12 21 12, 12
    assert distinct_n([[5]], 2) == 1.0 and distinct_n([], 1) == 1.0


def test_duplicates_and_top_share():
    assert duplicate_rate(["a", "b", "a", "a"]) == 0.5 and duplicate_rate(["a", "b"]) == 0.0
    assert top_share(["a", "b", "a", "a"]) == 0.75 and top_share([]) == 0.0


def test_collapse_metrics_of_a_table():
    def turns(*texts):
        return [{"response": t} for t in texts]

    table = pa.table(
        {
            "group": [0, 0, 1, 1],
            "token_ids": [[9, 1, 2], [9, 1, 2], [9, 3, 4], [9, 5, 6]],
            "loss_mask": [[0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]],
            "turns": [turns("Up"), turns("Up"), turns("Left", "Up"), turns("Down")],
        }
    )
    m = collapse_metrics(table)
    assert m["collapse/distinct1_group"] == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert m["collapse/distinct2_group"] == pytest.approx((1 / 2 + 2 / 2) / 2)
    assert m["collapse/distinct2_batch"] == pytest.approx(3 / 4)
    assert m["collapse/duplicate_rate_group"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["collapse/duplicate_rate_batch"] == pytest.approx(1 / 4)
    assert m["collapse/top_response_share"] == pytest.approx(2 / 4)
