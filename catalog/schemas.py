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
        ("staleness", pa.int64()),
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
        ("explored_turns", pa.list_(pa.int32())),
        ("drift", pa.int64()),
    ]
)


CROSS_SCORES = pa.schema(
    [
        ("run", pa.string()),
        ("iteration", pa.int64()),
        ("policy_version", pa.int64()),
        ("prompt", pa.int64()),
        ("response", pa.int64()),
        ("prompt_row", pa.int64()),
        ("response_row", pa.int64()),
        ("matched", pa.bool_()),
        ("logprob", pa.float64()),
        ("response_tokens", pa.int64()),
    ]
)


#: the views of the tables the built-in stages store, with their schemas: each exists,
#: empty, on a catalog that holds none of its rows yet (a stage of your own declares its
#: view's schema with ``Table(view=..., schema=...)`` and is added when registered)
TABLE_VIEWS: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORY_SCHEMA,
    "demonstrations": TRAJECTORY_SCHEMA,
    "evals": TRAJECTORY_SCHEMA,
    "cross_scores": CROSS_SCORES,
}


def conform(table: pa.Table) -> pa.Table:
    """A stored trajectory table in the current schema: columns added since it was
    written (e.g. ``staleness``) as nulls, in the schema's order and types."""
    for f in TRAJECTORY_SCHEMA:
        if f.name not in table.column_names:
            table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
    return table.select(TRAJECTORY_SCHEMA.names).cast(TRAJECTORY_SCHEMA)


#: derived view -> (the view it reads, its SELECT)
DERIVED_VIEWS: dict[str, tuple[str, str]] = {
    "turns": (
        "trajectories",
        'SELECT run, iteration, policy_version, env, seed, "group", sample, split, u.* '
        "FROM (SELECT *, unnest(turns) AS u FROM trajectories)",
    ),
    # what the policy did on each eval turn, read from the state it saw: where its move led
    # (FrozenLake's local and relative views and Sokoban's relative view label each move;
    # FrozenLake's grid is read cell by cell: `P` you, `O` a hole, `G` the goal, `_` ice),
    # whether it copied a word of the goal line (the local view's shortcut), and whether it went
    # toward the goal (FrozenLake's relative view: `Goal: rows +R, columns +C.`, or the grid's
    # `G` against `P`); NULL where the view does not say
    "eval_turns": (
        "evals",
        "SELECT run, policy_version, temperature, env, env_options, seed, sample, u.turn, u.state, a AS action, "
        "CASE WHEN a IN ('Left', 'Down', 'Right', 'Up') AND regexp_matches(u.state, '(^|\\n)(Left|Up): ') "
        "THEN regexp_extract(u.state, a || ': ([^.]+)', 1) "
        "WHEN a IN ('Left', 'Down', 'Right', 'Up') AND w IS NOT NULL AND p >= 0 THEN "
        "CASE WHEN nr < 0 OR nr >= (length(u.state) + 1) // w OR nc < 0 OR nc >= w - 1 THEN 'edge' "
        "ELSE CASE substr(u.state, nr * w + nc + 1, 1) WHEN 'O' THEN 'hole' WHEN 'G' THEN 'goal' ELSE 'ice' END "
        "END END AS leads_to, "
        "CASE WHEN a IS NOT NULL AND starts_with(u.state, 'Goal: ') "
        "THEN contains(split_part(u.state, chr(10), 1), a) END AS copies_goal_word, "
        "CASE WHEN a IN ('Left', 'Down', 'Right', 'Up') AND dr IS NOT NULL AND dc IS NOT NULL "
        "THEN (a = 'Down' AND dr > 0) OR (a = 'Up' AND dr < 0) OR (a = 'Right' AND dc > 0) OR (a = 'Left' AND dc < 0) "
        "END AS toward_goal "
        "FROM (SELECT *, unnest(turns) AS u FROM evals), LATERAL (SELECT u.actions[1] AS a), "
        # a FrozenLake grid: w is a row's length with its newline, p and g where you and the goal are
        "LATERAL (SELECT CASE WHEN regexp_full_match(u.state, '[_OPG]+(\\n[_OPG]+)+') "
        "THEN strpos(u.state, chr(10)) END AS w, strpos(u.state, 'P') - 1 AS p, strpos(u.state, 'G') - 1 AS g), "
        "LATERAL (SELECT p // w + CASE a WHEN 'Down' THEN 1 WHEN 'Up' THEN -1 ELSE 0 END AS nr, "
        "p % w + CASE a WHEN 'Right' THEN 1 WHEN 'Left' THEN -1 ELSE 0 END AS nc), "
        "LATERAL (SELECT COALESCE(TRY_CAST(regexp_extract(u.state, '^Goal: rows ([+-]?[0-9]+)', 1) AS INTEGER), "
        "CASE WHEN w IS NOT NULL AND p >= 0 AND g >= 0 THEN g // w - p // w END) AS dr, "
        "COALESCE(TRY_CAST(regexp_extract(u.state, '^Goal: rows [+-]?[0-9]+, columns ([+-]?[0-9]+)', 1) AS INTEGER), "
        "CASE WHEN w IS NOT NULL AND p >= 0 AND g >= 0 THEN g % w - p % w END) AS dc)",
    ),
    # per run, policy version and eval temperature: the share of eval moves into a hole, the
    # edge or a wall (a box that cannot move counts as a wall), of pushes onto a target or into a
    # corner (a box that never moves again), of goal-line copies, of moves toward the goal, and
    # of moves into a hole that were toward the goal (the hole lay on the way)
    "eval_behaviour": (
        "evals",
        "SELECT run, policy_version, temperature, env, count(*) AS turns, "
        "avg(CASE WHEN leads_to IS NOT NULL THEN (leads_to = 'hole')::int END) AS into_hole, "
        "avg(CASE WHEN leads_to IS NOT NULL THEN (leads_to = 'edge')::int END) AS into_edge, "
        "avg(CASE WHEN leads_to IS NOT NULL "
        "THEN (leads_to IN ('wall', 'a box that cannot move'))::int END) AS into_wall, "
        "avg(CASE WHEN leads_to IS NOT NULL THEN (leads_to = 'a box, pushed onto a target')::int END) "
        "AS onto_target, "
        "avg(CASE WHEN leads_to IS NOT NULL THEN (leads_to = 'a box, pushed into a corner')::int END) "
        "AS into_corner, "
        "avg(copies_goal_word::int) AS copies_goal_word, "
        "avg(toward_goal::int) AS toward_goal, "
        "avg(CASE WHEN leads_to = 'hole' THEN toward_goal::int END) AS hole_toward_goal "
        "FROM eval_turns GROUP BY ALL ORDER BY ALL",
    ),
}
