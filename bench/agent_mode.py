"""Agent mode's cost: sampled tokens/s of an agent program acting through the endpoint
(`stages.endpoint`, docs/agents.md) against our own agent loop, on the same episodes
(FrozenLake initial states, group sampling), the same engine and the same limits.

Our loop plays with the whole chat as one sample (``agent.history`` unset), as the
example chat agent (`examples/agents/frozenlake_chat.py`, written against the `openai`
client) keeps its history; both run ``--turns`` calls at most of ``--tokens`` tokens.
The unit is sampled tokens per second of the whole batch (environments, prompts, HTTP,
the `openai` client and the rounds included), and the time inside the engine's
``generate`` is shown beside it. Target: agent mode / own loop >= 0.8.

    python bench/agent_mode.py [--groups 8] [--group-size 4] [--turns 4] [--tokens 32] [--repeats 3]
                               [--model NAME_OR_DIR]   (default: the embedded default model, initial weights;
                               e.g. smollm2-135m-instruct, a packaged model)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from stages.agent.loop import AgentConfig
from stages.agent.play import PlayJob, episode_specs, play_batch
from stages.endpoint.episodes import serve_batch
from stages.endpoint.programs import ProgramConfig
from stages.engines.hf import HFEngine

CHAT = "examples.agents.frozenlake_chat:play"


class Timed:
    """An engine that adds up the time spent in its `generate`."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.tokenizer, self.seconds = engine, engine.tokenizer, 0.0

    def generate(self, prompts: list, params: Any) -> list:
        t = time.perf_counter()
        out = self.engine.generate(prompts, params)
        self.seconds += time.perf_counter() - t
        return out


def embedded_policy(where: Path) -> Path:
    """The embedded default model with initial weights, saved as a policy."""
    from stages.agent.corpus import embedded_tokenizer
    from stages.models.policy import EmbeddedModel, build_embedded, save_policy

    cfg = EmbeddedModel()
    model, tokenizer = build_embedded(cfg, 0, embedded_tokenizer(cfg.vocab_size))
    save_policy(model, tokenizer, where, version=0)
    return where


def measure(
    engine: Timed, agent: AgentConfig, seeds: list[int], group: int, seed: int, own: bool
) -> tuple[float, int, float]:
    """(seconds, sampled tokens, seconds in generate) of one batch."""
    specs = pa.Table.from_pylist([asdict(s) for s in episode_specs("frozenlake", None, seeds, group)])
    job = PlayJob(agent, agent.sampling(1.0), seed, 0)
    engine.seconds = 0.0
    t = time.perf_counter()
    table = (play_batch if own else serve_batch)(engine, specs, job)  # type: ignore[arg-type]
    seconds = time.perf_counter() - t
    return seconds, int(sum(table["response_tokens"].to_pylist())), engine.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="a packaged model's name or a local folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            from stages.models.initial import save_initial

            policy = save_initial(args.model, Path(tmp) / "policy", log=lambda _: None)
        else:
            policy = embedded_policy(Path(tmp) / "policy")
        engine = Timed(HFEngine(policy))
        own = AgentConfig(think=False, max_turns=args.turns, max_new_tokens=args.tokens)
        served = AgentConfig(
            think=False, max_turns=args.turns, max_new_tokens=args.tokens, program=ProgramConfig(function=CHAT)
        )
        measure(engine, own, [0], 1, 0, True)  # warm: the engine's first call, the openai client's import
        measure(engine, served, [0], 1, 0, False)
        rows: dict[str, list[tuple[float, int, float]]] = {"own loop": [], "agent mode": []}
        for r in range(args.repeats):
            seeds = [1000 * (r + 1) + g for g in range(args.groups)]
            rows["own loop"].append(measure(engine, own, seeds, args.group_size, r, True))
            rows["agent mode"].append(measure(engine, served, seeds, args.group_size, r, False))
    print(
        f"{args.groups} groups x {args.group_size}, at most {args.turns} calls of {args.tokens} tokens, "
        f"{args.model or 'the embedded default'}; median of {args.repeats}"
    )
    print(f"{'':12} {'tokens/s':>9} {'tokens':>7} {'s':>6} {'in generate':>12}")
    rate = {}
    for name, runs in rows.items():
        rate[name] = statistics.median(t / s for s, t, _ in runs)
        tokens = statistics.median(t for _, t, _ in runs)
        secs = statistics.median(s for s, _, _ in runs)
        share = statistics.median(g / s for s, _, g in runs)
        print(f"{name:12} {rate[name]:9.0f} {tokens:7.0f} {secs:6.2f} {share:11.0%}")
    ratios = [(t2 / s2) / (t1 / s1) for (s1, t1, _), (s2, t2, _) in zip(rows["own loop"], rows["agent mode"])]
    print(
        f"agent mode / own loop: {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}; target >= 0.8)"
    )


if __name__ == "__main__":
    main()
