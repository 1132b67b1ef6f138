import pyarrow as pa
import pytest
import torch

from catalog.schemas import TRAJECTORY_SCHEMA
from stages.advantage import BATCH_COLUMNS, AdvantageConfig, compute, keep_better_explored


def test_an_explored_turn_is_kept_only_where_its_advantage_is_positive():
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 0, 0, 0]])
    adv = torch.tensor([[0, 2, 2, 0, -1, -1, 0, 3], [0, -2, -2, 0, 1, 0, 0, 0]], dtype=torch.float32)
    out, dropped = keep_better_explored(adv, mask, [[2, 3], [1]])
    assert dropped == 2
    assert out.tolist() == [[0, 2, 2, 0, 0, 0, 0, 3], [0, 0, 0, 0, 1, 0, 0, 0]]
    assert adv[0, 4] == -1  # the input is left as it was
    same, none = keep_better_explored(adv, mask, [None, []])
    assert none == 0 and torch.equal(same, adv)


def table(explored):
    """Four trajectories of one group, one turn of two sampled tokens each, scores 1, 0, 0, 0."""
    rows = [
        {
            "run": "r",
            "iteration": 0,
            "policy_version": 0,
            "env": "e",
            "seed": 1,
            "group": 0,
            "sample": i,
            "temperature": 1.0,
            "token_ids": [5, 6, 7],
            "loss_mask": [0, 1, 1],
            "logprobs": [0.0, -0.1, -0.1],
            "score": float(i == 0),
            "segments": [3],
            "explored_turns": e,
        }
        for i, e in enumerate(explored)
    ]
    fields = [TRAJECTORY_SCHEMA.field(c) for c in (*BATCH_COLUMNS, "explored_turns")]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))


@pytest.mark.parametrize(("rule", "dropped"), [("better", 1), ("all", 0)])
def test_the_stage_drops_the_explored_turns_that_did_worse(rule, dropped):
    out, metrics = compute(table([[1], [1], [], []]), AdvantageConfig(estimator="grpo", explored=rule), None)
    adv = out["advantages"].to_pylist()
    assert adv[0][1] > 0  # explored and better than the group: trained
    assert (adv[1][1] == 0) == (rule == "better")  # explored and worse: left out under `better`
    assert adv[2][1] < 0 and adv[3][1] < 0  # the policy's own turns are trained either way
    assert metrics["adv/explored_dropped"] == dropped
