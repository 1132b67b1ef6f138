"""Comparators: every scripted rule a trained FrozenLake policy must beat, on the
eval's own validation lakes.

For one setting (the FrozenLake options, the number of validation seeds, the action
budget) it prints the success of:

- each text-only rule of `envs.lake_rules` (it reads only the observation text),
- `toward_goal` (reads the map but not its holes: a move that gets closer) and
  `greedy_safe` (reads the map: a safe move that gets closer),
- the warm start's demonstrator (`expert` with `--random-share` of its actions from
  the `--noise` policy: the default's, 80% from a safe random walker) and the clean
  expert (value iteration),
- uniform random, exactly (dynamic programming) and sampled,

split into lakes whose goal is fewer than 3 moves from the start and the rest, and,
with `--run`, the eval success of that run's warm start and of its last policy from
the catalog's `evals` view (sampled at the eval's temperature). The verdict line
says how far the best text-only rule stands from `greedy_safe`.

    python experiments/comparators.py                               # the default's view (render: grid)
    python experiments/comparators.py --render relative             # starpo-relative.yaml's
    python experiments/comparators.py --render local --random-share 0.5 --noise random_valid   # starpo-local.yaml's
    python experiments/comparators.py --render grid --slippery
    python experiments/comparators.py --run starpo --catalog pipeline-data
    python experiments/comparators.py --env sokoban --render relative --max-solution-steps 6 --max-actions 8

Sokoban (`--env sokoban`, the `relative` view) has its own text-only rules
(`envs.sokoban_rules`), no `greedy_safe` and no exact random success; "near" is a room
solvable in at most 4 moves.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import envs
from common.recording import Recorder
from envs.frozenlake import FrozenLake
from envs.lake_rules import RULES, TEXT_RULES, random_success
from envs.policies import Policy, expert, make_policy, play, random_valid
from envs.sokoban import Sokoban
from envs.sokoban_rules import TEXT_RULES as SOKOBAN_TEXT_RULES
from stages.agent.play import validation_seeds


def noisy(share: float, seed: int, noise: str = "random_valid") -> Policy:
    """The warm start's demonstrator: the expert, with `share` of its actions from `noise`."""
    best, rng, coin = expert(seed), make_policy(noise, seed), random.Random(f"noisy:{seed}")

    def act(env: envs.TextEnv) -> str:
        return rng(env) if coin.random() < share else best(env)

    return act


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="frozenlake", choices=("frozenlake", "sokoban"))
    ap.add_argument(
        "--render", default="grid", help="the view (the default run's: grid; starpo-relative.yaml's: relative)"
    )
    ap.add_argument("--max-solution-steps", type=int, default=6, help="sokoban: the rooms' bound on optimal moves")
    ap.add_argument("--slippery", action="store_true")
    ap.add_argument("--size", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=256, help="validation seeds (the eval's)")
    ap.add_argument("--max-actions", type=int, default=5, help="the agent's action budget per episode")
    ap.add_argument("--repeats", type=int, default=16, help="plays per seed for the stochastic policies")
    ap.add_argument("--random-share", type=float, default=0.8, help="the demonstrator's share of noise actions")
    ap.add_argument(
        "--noise",
        default="random_safe",
        choices=("random_valid", "random_safe"),
        help="the policy of the demonstrator's noise actions (warmstart.noise)",
    )
    ap.add_argument("--run", help="also show this run's warm-start and last eval success (from --catalog)")
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    args = ap.parse_args()
    out = Recorder()

    lake = args.env == "frozenlake"
    options: dict[str, object] = (
        {"slippery": args.slippery, "render": args.render, "size": args.size}
        if lake
        else {"render": args.render, "max_solution_steps": args.max_solution_steps}
    )
    seeds = validation_seeds(args.episodes)
    env = envs.make(args.env, **options)
    near: dict[int, bool] = {}
    exact = []
    for s in seeds:
        env.reset(s, "validation")
        if isinstance(env, FrozenLake):
            near[s] = abs(env.start[0] - env.goal[0]) + abs(env.start[1] - env.goal[1]) < 3
            exact.append((s, random_success(env, args.max_actions)))
        else:
            assert isinstance(env, Sokoban)
            near[s] = env.optimal_steps <= 4
    text_rules = TEXT_RULES if lake else SOKOBAN_TEXT_RULES

    def split(values: list[tuple[int, float]]) -> tuple[float, float, float]:
        a = [v for s, v in values if near[s]]
        b = [v for s, v in values if not near[s]]
        mean = sum(v for _, v in values) / len(values)
        return mean, sum(a) / max(len(a), 1), sum(b) / max(len(b), 1)

    policies = {
        **(RULES if lake else SOKOBAN_TEXT_RULES),
        f"demonstrator ({args.random_share:g} {args.noise})": lambda seed: noisy(args.random_share, seed, args.noise),
        "expert": expert,
        "random (sampled)": random_valid,
    }
    rows: list[tuple[str, tuple[float, float, float]]] = []
    for name, make in policies.items():
        repeats = 1 if name == "expert" else args.repeats
        values = []
        for s in seeds:
            wins = sum(play(env, make(1000 * r + 7), s, args.max_actions, "validation")[0] for r in range(repeats))
            values.append((s, wins / repeats))
        rows.append((name, split(values)))
    if exact:
        rows.append(("random (exact, DP)", split(exact)))
    if args.run:
        rows += _run_rows(args.run, args.catalog)

    n_near = sum(near.values())
    what = "lakes ({} with the goal < 3 moves away)" if lake else "rooms ({} solvable in <= 4 moves)"
    out.line(f"{args.env} {options}, {len(seeds)} validation {what.format(n_near)}, {args.max_actions} actions")
    out.line(f"{'policy':34s} {'success':>8s} {'near':>7s} {'far':>7s}")
    for name, (mean, a, b) in rows:
        kind = " (text)" if name in text_rules else ""
        out.line(f"{name + kind:34s} {mean:8.1%} {a:7.1%} {b:7.1%}")
    best_text = max((r for r in rows if r[0] in text_rules), key=lambda r: r[1][0])
    greedy = next((r for r in rows if r[0] == "greedy_safe"), None)
    if greedy is None:
        out.line(f"best text-only rule: {best_text[0]} {best_text[1][0]:.1%}")
    else:
        out.line(
            f"best text-only rule: {best_text[0]} {best_text[1][0]:.1%}; greedy_safe {greedy[1][0]:.1%}; "
            f"gap {100 * (greedy[1][0] - best_text[1][0]):+.1f} points"
        )
    if args.save:
        out.save(args.save, {"success": {name: mean for name, (mean, _, _) in rows}})


def _run_rows(run: str, root: str | None) -> list[tuple[str, tuple[float, float, float]]]:
    """The run's warm start and last policy, sampled at the eval temperature and greedy
    where the eval played greedily too."""
    from catalog.query import query
    from catalog.store import existing_catalog

    rows = query(
        existing_catalog(root),
        f"select temperature t, policy_version v, avg(success::int) s from evals "
        f"where run = '{run.replace(chr(39), '')}' group by all order by t desc, v",
    ).to_pylist()
    out = []
    for t in dict.fromkeys(r["t"] for r in rows):
        curve = [r for r in rows if r["t"] == t]
        for which, r in (("warm start", curve[0]), ("last policy", curve[-1])):
            out.append((f"{run}: {which} (v{r['v']}, T={t:g})", (r["s"], float("nan"), float("nan"))))
    return out


if __name__ == "__main__":
    main()
