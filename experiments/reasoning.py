"""Does the policy's reasoning hold, and does its answer follow it? The bandit with its
payoffs stated (`bandit` with `payoffs: true`, docs/history.md#names-it-has-never-seen):
every eval turn's thought is checked by rule against the prompt it saw.

For each run, policy version and eval environment, over the eval turns at the lowest
temperature:

- `states`: the thought states an expected payoff for both arms;
- `right`: the payoffs it states are the arms' true expectations in that episode (the gamble's
  depends on its odds: 0.25 at the paper's, 0.05 at `high_p: 0.05`, where it is the worse arm);
- `follows`: the answer is the arm whose stated expectation is the larger (of the turns
  that state both);
- `success`: the answer is the arm with the larger expected payoff (the eval's success).

A policy whose thought is right and whose answer follows it reads the payoffs and acts on
them; right thoughts with an answer that does not follow is reasoning that does not pay.

    python experiments/reasoning.py --catalog cat --like 'seeds-smollm2-bandit-reasoned-%'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import envs
from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script
from envs.bandit import arms_of
from envs.bandit import judge as rule

TURNS = """
select e.run, e.policy_version as version, e.env, e.env_options, e.seed, e.split, u.state as state, u.think as think,
       u.actions[1] as action, e.success
from (select *, unnest(turns) as u from evals where run like '{like}' and temperature = (
      select min(temperature) from evals where run like '{like}')) e
order by e.run, version, e.env
"""


def judge(
    state: str, think: str, action: str | None, success: bool, expected: dict[str, float]
) -> dict[str, bool | None]:
    """The environment's rule on one turn (`envs.bandit.judge`); `expected`: what each arm
    pays on average in that episode."""
    arms = arms_of(state)
    if arms is None:
        return {"states": False, "right": None, "follows": None, "success": success}
    said = rule(arms, think, action, expected)
    return {"states": said.states, "right": said.right, "follows": said.follows, "success": success}


def expectations(env: Any, seed: int, split: str) -> dict[str, float]:
    """What each arm paid on average in the episode of `seed` (the environment replayed to
    its first state)."""
    env.reset(seed, split)
    return {arm: env.expected(arm) for arm in env.order}


def share(rows: list[dict[str, bool | None]], key: str) -> str:
    judged = [r[key] for r in rows if r[key] is not None]
    return f"{100 * sum(bool(x) for x in judged) / len(judged):.1f}%" if judged else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--like", required=True, help="runs whose name is LIKE this SQL pattern")
    ap.add_argument("--versions", default=None, help="only these policy versions, comma-separated (default: all)")
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    rows = query(existing_catalog(args.catalog), TURNS.format(like=args.like.replace("'", "''"))).to_pylist()
    if args.versions:
        wanted = {int(v) for v in args.versions.split(",")}
        rows = [r for r in rows if r["version"] in wanted]
    if not rows:
        raise SystemExit(f"no eval turns of runs like {args.like!r}")
    out = Recorder()
    out.line("| run | version | env | turns | thought states both | thought right | answer follows it | success |")
    out.line("|---|---|---|---|---|---|---|---|")
    data = []
    keys = sorted({(r["run"], r["version"], r["env"]) for r in rows})
    for run, version, env in keys:
        these = [r for r in rows if (r["run"], r["version"], r["env"]) == (run, version, env)]
        played = envs.make(env, **json.loads(these[0]["env_options"] or "{}"))
        judged = [
            judge(r["state"], r["think"], r["action"], r["success"], expectations(played, r["seed"], r["split"]))
            for r in these
        ]
        cells = [share(judged, k) for k in ("states", "right", "follows", "success")]
        out.line(f"| {run} | {version} | {env} | {len(these)} | " + " | ".join(cells) + " |")
        data.append(
            {
                "run": run,
                "version": version,
                "env": env,
                "turns": len(these),
                **dict(zip(("states", "right", "follows", "success"), cells)),
            }
        )
    if args.save:
        out.save(args.save, data={"rows": data})


if __name__ == "__main__":
    run_script(main)
