"""Probe pretraining levers: how fast a fresh embedded model learns to read a state.

Each variant builds a fresh model, trains it on probe answers (`stages.training.pretrain`,
the `pretrain` stage's own samples: questions about states asked in the agent's
first-turn prompt) for `--steps` steps, and prints the held-out exact-match
accuracy of every task every `--every` steps. With `--warmstart N`, the model then
goes through N steps of the warm start's objective (`bench/warmstart.py`: noisy-free
expert demonstrations, action-word loss) and the held-out expert-move accuracy is
printed: what the `grid` warm start gains from pretraining.

    python bench/pretrain.py                                       # grid FrozenLake, the default variants
    python bench/pretrain.py --variants base,untied+lr3e-3 --steps 3000 --warmstart 600
    python bench/pretrain.py --env sokoban --render ''

A variant is a name from VARIANTS, or several joined by "+".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from stages.agent.loop import AgentConfig
from stages.training.pretrain import accuracy, probe_samples, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warmstart as ws

VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "lr3e-3": {"lr": 3e-3},
    "lr3e-4": {"lr": 3e-4},
    "untied": {"untied": True},
    "init0.05": {"init": 0.05},
    "wide": {"model": {"hidden_size": 256, "intermediate_size": 768}},
    "deep": {"model": {"layers": 8}},
    "batch32": {"batch": 32},
}
BASE: dict[str, Any] = {**ws.BASE, "lr": 1e-3, "batch": 16}


def run(name: str, args: argparse.Namespace) -> str:
    settings = dict(BASE)
    for part in name.split("+"):
        settings.update(VARIANTS[part])
    torch.manual_seed(args.seed)
    model, tokenizer = ws.build(settings, args.seed)
    agent = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    options = {"slippery": False, "render": args.render} if args.env == "frozenlake" else None
    seeds = list(range(5 * 10**12, 5 * 10**12 + args.states))
    samples = [s for _, s in probe_samples(args.env, options, seeds, tokenizer, agent)]
    held = probe_samples(args.env, options, list(range(6 * 10**12, 6 * 10**12 + 200)), tokenizer, agent)
    opt = torch.optim.AdamW(model.parameters(), lr=settings["lr"], weight_decay=settings["wd"])
    g = torch.Generator().manual_seed(args.seed)
    cells, t0 = [], time.time()
    for step in range(args.every, args.steps + 1, args.every):
        train(model, samples, args.every, settings["batch"], opt, tokenizer.pad_token_id, g)
        acc = accuracy(model, held, tokenizer.pad_token_id)
        cells.append(f"{step}:" + "/".join(f"{v:.2f}" for v in acc.values()))
    tasks = "/".join(sorted({t for t, _ in held}))
    warm = ""
    if args.warmstart:
        warm = " | " + warm_start(model, tokenizer, settings, args)
    return f"| {name} | {tasks} | {' '.join(cells)} | {time.time() - t0:.0f}{warm} |"


def warm_start(model: Any, tokenizer: Any, settings: dict[str, Any], args: argparse.Namespace) -> str:
    """`--warmstart` steps of the warm start's objective; held-out expert-move mass/accuracy."""
    train_set, test = ws.data(0, 0.0, args.render, 1024, args.seed, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed)
    every = max(1, args.warmstart // 3)
    line = []
    for step in range(0, args.warmstart + 1, every):
        if step:
            train(model, train_set, every, 8, opt, tokenizer.pad_token_id, g, action_weight=1.0)
        model.eval()
        mass, acc = ws.score(model, test[:256])
        line.append(f"{step}:{mass:.2f}/{acc:.2f}")
    return " ".join(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="base,lr3e-3,untied,init0.05")
    ap.add_argument("--env", default="frozenlake")
    ap.add_argument("--render", default="grid")
    ap.add_argument("--states", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--warmstart", type=int, default=0, help="warm-start steps after pretraining (FrozenLake)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{args.env} render={args.render!r}: {args.steps} steps; cells: step:accuracy per task")
    head = "| variant | tasks | curve | s" + (" | warm start step:mass/accuracy" if args.warmstart else "") + " |"
    print(head + "\n" + "|---" * head.count("|") + "|")
    for name in args.variants.split(","):
        print(run(name, args), flush=True)


if __name__ == "__main__":
    main()
