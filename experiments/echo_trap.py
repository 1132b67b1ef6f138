"""The Echo Trap, per iteration, from a run's stored trajectories: does the reasoning
collapse to a template, and does the answer follow a shortcut instead of the task?

For each iteration of a bandit run (rollout trajectories, one turn each) it prints the
share of pulls of the high-risk arm (the task's success), format-valid, distinct
responses in the batch (a template shows as a handful), the share of answers that name
the arm listed first in the state (a position shortcut: 0.5 by chance, 1.0 for a policy
that reads only the order), the sampled tokens the update trained on (0: the filter kept
nothing) and the policy entropy. Then, per iteration, the diagnostics the paper reads
for the Echo Trap: the reward's std over the batch and within groups, the gradient norm,
the share of duplicate responses within a group (with thinking on, the reasoning is most
of a response), the `mutual_info` stage's MI and retrieval where it ran, and the warnings
the run fired. Then its evals, and the distinct thoughts (with their counts) of the first
and the last iteration.

    pipeline run starpo-smollm2-bandit.yaml --catalog cat        # about 2.5 min an iteration here
    python experiments/echo_trap.py --catalog cat --run starpo-smollm2-bandit
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import existing_catalog
from common.errors import UserError

PER_ITERATION = """
with t as (
  select iteration, success, format_valid_rate, turns[1].response as response, turns[1].answer as answer,
         split_part(split_part(turns[1].state, ': ', 2), ',', 1) as first_named
  from trajectories where run = '{run}'
), m as (
  select iteration, max(case when name = 'actor/tokens' then value end) as trained_tokens,
         max(case when name = 'actor/entropy' then value end) as entropy
  from metrics where run = '{run}' group by iteration
)
select t.iteration, count(*) as n, round(avg(success::int), 3) as high_arm, round(avg(format_valid_rate), 3) as fmt,
       count(distinct response) as distinct_responses, round(avg((answer = first_named)::int), 3) as first_named,
       any_value(m.trained_tokens) as trained_tokens, round(any_value(m.entropy), 3) as entropy
from t left join m using (iteration) group by t.iteration order by t.iteration
"""

DIAGNOSTICS = """
with m as (
  select iteration,
         max(case when name = 'rollout/score_std' then value end) as score_std,
         max(case when name = 'rollout/in_group_std' then value end) as in_group_std,
         max(case when name = 'actor/grad_norm' then value end) as grad_norm,
         max(case when name = 'collapse/duplicate_rate_group' then value end) as dup_in_group,
         max(case when name = 'template/mi' then value end) as mi,
         max(case when name = 'template/retrieval' then value end) as retrieval
  from metrics where run = '{run}' and iteration is not null group by iteration
), w as (
  select iteration, string_agg(distinct rule, ' ' order by rule) as warnings from events where run = '{run}' group by iteration
)
select m.iteration, round(score_std, 3) as score_std, round(in_group_std, 3) as in_group_std,
       round(grad_norm, 3) as grad_norm, round(dup_in_group, 3) as dup_in_group, round(mi, 3) as mi,
       round(retrieval, 3) as retrieval, coalesce(w.warnings, '') as warnings
from m left join w using (iteration) order by m.iteration
"""

THOUGHTS = """
with t as (
  select iteration, trim(turns[1].think) as thought from trajectories
  where run = '{run}' and iteration in (select min(iteration) from trajectories where run = '{run}'
                                        union select max(iteration) from trajectories where run = '{run}')
)
select iteration, count(*) as n, thought from t where thought <> '' group by all order by iteration, n desc, thought
"""

EVALS = """
select iteration, name, round(value, 3) as value from metrics
where run = '{run}' and name like 'eval/%success_rate' order by iteration nulls first, name
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", default=None, help="catalog root (default: $PIPELINE_CATALOG or ./pipeline-data)")
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    catalog = existing_catalog(args.catalog)
    run = args.run.replace("'", "''")
    for sql in (PER_ITERATION, DIAGNOSTICS, EVALS, THOUGHTS):
        try:
            table = query(catalog, sql.format(run=run))
        except UserError as exc:  # e.g. a run that has no rollout yet
            raise SystemExit(f"{catalog.root.uri}: {exc}") from None
        names = table.column_names
        print("| " + " | ".join(names) + " |")
        print("|" + "---|" * len(names))
        for row in table.to_pylist():
            print("| " + " | ".join("" if row[c] is None else str(row[c]) for c in names) + " |")
        print()


if __name__ == "__main__":
    main()
