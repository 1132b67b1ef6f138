"""Zero-shot: a real instruct model, before any training, on every environment.

For each environment (bandit, FrozenLake on the paper's grid and on the `relative`
view, Sokoban, Countdown), with thinking on and off, it plays `--episodes`
validation seeds through the real agent loop and `hf` engine at T = 0.5 and greedily,
and prints format-valid and success beside uniform random, the constant rule that
always answers the prompt's example action (what a model that copies the example
scores), and the environment's text-only rules (`envs.lake_rules`,
`envs.sokoban_rules`). FrozenLake and Sokoban play 5 turns of one action (the
default's budget), bandit and Countdown one turn. The prompt shows the format by
example (`agent.example`); `--no-example` plays the paper's prompt with placeholders.

    python experiments/zeroshot.py                      # smollm2-135m-instruct, 64 episodes (about 40 min here)
    python experiments/zeroshot.py --episodes 16 --envs bandit frozenlake-grid --no-example

The table is written to ``experiments/results/zeroshot-<model>[-placeholders].json`` too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

import envs
from envs.lake_rules import TEXT_RULES as LAKE_RULES
from envs.policies import Policy, play, random_valid
from envs.sokoban_rules import TEXT_RULES as SOKOBAN_RULES
from stages.agent.loop import AgentConfig
from stages.agent.play import PlayJob, episode_specs, play_batch, validation_seeds
from stages.engines.hf import HFEngine
from stages.models.initial import save_initial

#: name -> (environment, options, turns, text-only rules)
SETTINGS: dict[str, tuple[str, dict[str, Any], int, dict[str, Any]]] = {
    "bandit": ("bandit", {}, 1, {}),
    "frozenlake-grid": ("frozenlake", {"slippery": False, "render": "grid"}, 5, LAKE_RULES),
    "frozenlake-relative": ("frozenlake", {"slippery": False, "render": "relative"}, 5, LAKE_RULES),
    "sokoban": ("sokoban", {"max_solution_steps": 6}, 5, {}),
    "countdown": ("countdown", {}, 1, {}),
    "sokoban-relative": ("sokoban", {"max_solution_steps": 6, "render": "relative"}, 5, SOKOBAN_RULES),
}


def agent_for(turns: int, think: bool, example: bool) -> AgentConfig:
    budget = {"max_turns": turns, "max_actions_per_turn": 1, "max_actions_per_traj": turns} if turns > 1 else {}
    return AgentConfig(
        think=think, history=0, stop_at_answer=True, example=example, max_new_tokens=64 if think else 32, **budget
    )


def rule_success(env: envs.TextEnv, policy: Policy, seeds: list[int], turns: int) -> float:
    return sum(play(env, policy, s, turns, "validation")[0] for s in seeds) / len(seeds)


def comparators(name: str, seeds: list[int]) -> dict[str, float]:
    env_name, options, turns, rules = SETTINGS[name]
    env = envs.make(env_name, **options)
    out = {"random": sum(rule_success(env, random_valid(r), seeds, turns) for r in range(8)) / 8}
    if env.action_words:  # the rule a model that copies the example action plays
        out["always the example"] = rule_success(env, lambda e: e.example_action, seeds, turns)
    for rule, make in rules.items():
        try:
            out[rule] = rule_success(env, make(0), seeds, turns)
        except (KeyError, ValueError, AttributeError):  # a rule that reads another view
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--envs", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--no-example", action="store_true", help="the paper's prompt, placeholders only")
    ap.add_argument("--show", action="store_true", help="print the table of the last result file, run nothing")
    args = ap.parse_args()
    if args.show:
        print(markdown(json.loads(result_file(args.model, args.no_example).read_text())))
        return
    seeds = validation_seeds(args.episodes)
    rows: list[dict[str, Any]] = []
    out = result_file(args.model, args.no_example)
    out.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engine = HFEngine(save_initial(args.model, Path(tmp) / "policy"))
        for name in args.envs:
            env_name, options, turns, _ = SETTINGS[name]
            rules = comparators(name, seeds)
            for think in (False, True):
                agent = agent_for(turns, think, not args.no_example)
                specs = episode_specs(env_name, options, seeds, 1, "validation")
                items = pa.Table.from_pylist([asdict(s) for s in specs])
                for temperature in (0.5, 0.0):
                    start = time.perf_counter()
                    table = play_batch(engine, items, PlayJob(agent, agent.sampling(temperature), 0, 32))
                    seconds = time.perf_counter() - start
                    played = table.to_pylist()
                    row = {
                        "setting": name,
                        "think": think,
                        "temperature": temperature,
                        "format_valid": sum(r["format_valid_rate"] for r in played) / len(played),
                        "success": sum(r["success"] for r in played) / len(played),
                        "response_tokens": sum(r["response_tokens"] for r in played) / len(played),
                        "seconds": seconds,
                        "comparators": rules,
                        "sample": played[0]["turns"][0]["response"][:120],
                    }
                    rows.append(row)
                    result = {
                        "model": args.model,
                        "episodes": args.episodes,
                        "example": not args.no_example,
                        "rows": rows,
                    }
                    out.write_text(json.dumps(result, indent=1) + "\n")  # after every row: a long run keeps its part
                    best = max(rules.items(), key=lambda kv: kv[1])
                    print(
                        f"{name:20s} think={think!s:5s} T={temperature:g}: format-valid {row['format_valid']:6.1%} "
                        f"success {row['success']:6.1%} | random {rules['random']:.1%}, best rule {best[0]} "
                        f"{best[1]:.1%} | {row['response_tokens']:.0f} tokens/episode, {seconds:.0f} s "
                        f"| {row['sample']!r}",
                        flush=True,
                    )
    print(markdown(json.loads(out.read_text())))
    print(f"written: {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


def result_file(model: str, placeholders: bool) -> Path:
    suffix = "-placeholders" if placeholders else ""
    return Path(__file__).resolve().parent / "results" / f"zeroshot-{model}{suffix}.json"


def markdown(result: dict[str, Any]) -> str:
    """The result file as a markdown table: a row per setting and thinking, T = 0.5 / greedy."""
    lines = [
        f"{result['model']}, {result['episodes']} validation episodes each, "
        f"{'the format shown by example' if result.get('example', True) else 'placeholders only'}; "
        "T = 0.5 / greedy",
        "",
        "| setting | thinking | format-valid | success | random | always the example | best text-only rule |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = result["rows"]
    for a, b in zip(rows[::2], rows[1::2]):
        rules = a["comparators"]
        text = {k: v for k, v in rules.items() if k not in ("random", "always the example")}
        best = max(text.items(), key=lambda kv: kv[1]) if text else None
        example = rules.get("always the example")
        lines.append(
            f"| {a['setting']} | {'on' if a['think'] else 'off'} "
            f"| {a['format_valid']:.1%} / {b['format_valid']:.1%} | {a['success']:.1%} / {b['success']:.1%} "
            f"| {rules['random']:.1%} | {'-' if example is None else f'{example:.1%}'} "
            f"| {'-' if best is None else f'{best[0]} {best[1]:.1%}'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
