"""A preset on an ecosystem environment, beside simple rules: the eval of
`experiments/starpo-smollm2-arithmetic.yaml` (reasoning-gym's basic_arithmetic) at
each version it was evaluated, and what rules that read the question score on the same
held-out problems, scored by the same environment (the task's own score_answer).

    pipeline run experiments/starpo-smollm2-arithmetic.yaml --catalog CATALOG
    python experiments/ecosystem.py --catalog CATALOG --save ecosystem-arithmetic-s0

Its rows: the run's eval at each version; its success on the problems it trained on (the
rollouts', sampled at T = 1), first and last; then the rules.

The rules: the first number; the larger number; the two numbers added whatever the
operator (right on every sum: the shortcut a policy that learned only "add" would take);
the task's reference answer (the expert).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import envs
from common.recording import Recorder, run_script
from envs.reasoning_gym import ReasoningGym
from pipelines.graph.load import load_spec
from stages.agent.play import validation_seeds

PRESET = "experiments/starpo-smollm2-arithmetic.yaml"
NUMBERS = re.compile(r"\d+")


def _numbers(question: str) -> list[int]:
    return [int(n) for n in NUMBERS.findall(question)]


RULES: dict[str, Callable[[ReasoningGym], str]] = {
    "the first number": lambda env: str(_numbers(env.question())[0]),
    "the larger number": lambda env: str(max(_numbers(env.question()))),
    "add the numbers, whatever the operator": lambda env: str(sum(_numbers(env.question()))),
    "the reference answer (expert)": lambda env: str(env.reference()),
}


def distinct(options: dict, episodes: int) -> int:
    """How many different problems the eval's episodes hold (the task's space can be small)."""
    env = envs.make("reasoning_gym", **options)
    return len({env.reset(seed, "validation") for seed in validation_seeds(episodes)})


def rule_rates(options: dict, episodes: int) -> dict[str, float]:
    """Each rule's success on the eval's held-out problems (`validation_seeds`), scored by the environment."""
    env = envs.make("reasoning_gym", **options)
    assert isinstance(env, ReasoningGym)
    wins = dict.fromkeys(RULES, 0)
    for seed in validation_seeds(episodes):
        for name, rule in RULES.items():
            env.reset(seed, "validation")
            env.step(rule(env))
            wins[name] += env.success
    return {name: won / episodes for name, won in wins.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None, help="the catalog the preset ran in (its evals)")
    ap.add_argument("--run", default="starpo-smollm2-arithmetic")
    ap.add_argument("-o", dest="overrides", action="append", default=[], help="an override the run had (KEY=VALUE)")
    ap.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    args = ap.parse_args()
    nodes = {n.name: n for n in load_spec(PRESET, args.overrides).nodes}
    options = dict(nodes["rollout"].config.env_options)
    episodes = int(nodes["eval"].config.episodes)
    out = Recorder()
    out.line(f"| policy or rule | success on {episodes} held-out episodes ({distinct(options, episodes)} problems) |")
    out.line("|---|---|")
    versions: list[tuple[int, float]] = []
    if args.catalog:
        from catalog.query import query
        from catalog.store import existing_catalog

        catalog = existing_catalog(args.catalog)
        sql = (
            "select policy_version, avg(success::int) as rate, count(*) as n from evals "
            f"where run = '{args.run}' and env = 'reasoning_gym' group by 1 order by 1"
        )
        for row in query(catalog, sql).to_pylist():
            versions.append((int(row["policy_version"]), float(row["rate"])))
            out.line(f"| {args.run} v{row['policy_version']} | {100 * row['rate']:.1f}% |")
        sql = (
            "select iteration, avg(success::int) as rate from trajectories "
            f"where run = '{args.run}' group by 1 order by 1"
        )
        train = [float(r["rate"]) for r in query(catalog, sql).to_pylist()]
        if len(train) >= 10:
            out.line(
                f"| {args.run}, its training problems: iteration 0 / the last 5 | "
                f"{100 * train[0]:.1f}% / {100 * sum(train[-5:]) / 5:.1f}% |"
            )
    for name, rate in rule_rates(options, episodes).items():
        out.line(f"| rule: {name} | {100 * rate:.1f}% |")
    if len(versions) >= 2:
        out.line(
            f"gain {100 * (versions[-1][1] - versions[0][1]):+.1f} points from v{versions[0][0]} to v{versions[-1][0]}"
        )
    if args.save:
        out.save(args.save, {"versions": versions, "episodes": episodes})


if __name__ == "__main__":
    run_script(main)
