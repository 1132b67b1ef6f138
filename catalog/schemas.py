"""Arrow schemas of the stored trajectories, and the views derived from them.

One row per trajectory (`TRAJECTORY_SCHEMA`), one row per turn in the `turns`
view; docs/trajectories.md says what each column means (a test keeps the two in
step).
"""

from __future__ import annotations

import pyarrow as pa

TURN = pa.struct(
    [
        ("turn", pa.int32()),
        ("state", pa.string()),
        ("response", pa.string()),
        ("think", pa.string()),
        ("answer", pa.string()),
        ("actions", pa.list_(pa.string())),
        ("valid", pa.list_(pa.bool_())),
        ("executed", pa.int32()),
        ("reward", pa.float64()),
        ("format_ok", pa.bool_()),
        ("finished", pa.bool_()),
        ("tokens", pa.int32()),
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("iteration", pa.int64()),
        ("policy_version", pa.int64()),
        ("policy_key", pa.string()),
        ("env", pa.string()),
        ("env_options", pa.string()),
        ("seed", pa.int64()),
        ("group", pa.int64()),
        ("sample", pa.int64()),
        ("split", pa.string()),
        ("temperature", pa.float64()),
        ("token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("turns", pa.list_(TURN)),
        ("score", pa.float64()),
        ("success", pa.bool_()),
        ("num_turns", pa.int32()),
        ("num_actions", pa.int32()),
        ("format_valid_rate", pa.float64()),
        ("response_tokens", pa.int64()),
        ("end_reason", pa.string()),
        ("truncated_context", pa.bool_()),
        ("truncated_response", pa.bool_()),
        ("segments", pa.list_(pa.int32())),
    ]
)

#: derived view -> (the view it reads, its SELECT)
DERIVED_VIEWS: dict[str, tuple[str, str]] = {
    "turns": (
        "trajectories",
        'SELECT run, iteration, policy_version, env, seed, "group", sample, split, u.* '
        "FROM (SELECT *, unnest(turns) AS u FROM trajectories)",
    ),
}
