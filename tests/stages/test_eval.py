import pyarrow as pa
import pytest

from stages.eval import env_metrics


def test_success_and_pass_at_k_by_hand():
    # two seeds per env, two tries each: sokoban solves seed 1 once; frozenlake solves nothing
    table = pa.table(
        {
            "env": ["sokoban"] * 4 + ["frozenlake"] * 4,
            "seed": [1, 1, 2, 2, 1, 1, 2, 2],
            "success": [True, False, False, False, False, False, False, False],
            "format_valid_rate": [1.0] * 8,
            "score": [10.0, -1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0],
        }
    )
    m = env_metrics(table, ("sokoban", "frozenlake"), samples=2)
    assert m["eval/sokoban/success_rate"] == 0.25 and m["eval/sokoban/pass@2"] == 0.5
    assert m["eval/frozenlake/pass@2"] == 0.0
    assert m["eval/success_rate"] == pytest.approx(0.125)
    assert "eval/sokoban/pass@1" not in env_metrics(table, ("sokoban",), samples=1)
