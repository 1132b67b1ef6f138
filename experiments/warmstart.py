"""Warm-start levers: how fast a fresh embedded model learns to *decide* from
demonstrations, on the warm start's own samples.

Demonstrations are played by `stages.warmstart.demonstrations` through the agent
loop (the rollout's prompts, tokens and history window) on a deterministic lake,
think off, one action per turn. Each variant trains a freshly built model with
`stages.training.sft` for `--steps` optimiser steps and reports, every `--every` steps, on
held-out demonstration turns: the probability mass on the demonstrated action
(renormalised over the action words; 0.25 is a blind policy that learned only the
format) and the share of turns whose most likely action word is the demonstrated one.

    python experiments/warmstart.py                                  # the default variants (~10 min, 2 cores)
    python experiments/warmstart.py --variants plain,action --steps 600
    python experiments/warmstart.py --history full --variants action

A variant is a name from VARIANTS, or several joined by "+": each changes one lever
against `action` (action-word loss 1.0, lr 1e-3, batch 8 samples, the embedded
model's defaults).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from stages.agent.corpus import embedded_model
from stages.agent.loop import AgentConfig
from stages.models.policy import EmbeddedModel
from stages.training.sft import Sample, samples, sft_loss
from stages.warmstart import WarmstartConfig, demonstrations

#: variant -> settings changed against the base (see `train`)
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"action": 0.0},
    "action": {},
    "action3": {"action": 3.0},
    "lr3e-3": {"lr": 3e-3},
    "lr3e-4": {"lr": 3e-4},
    "no-warmup": {"warmup": 0},
    "init0.006": {"init": 0.006},
    "init0.05": {"init": 0.05},
    "untied": {"untied": True},
    "wide": {"model": {"hidden_size": 256, "intermediate_size": 768}},
    "deep": {"model": {"layers": 8}},
    "shallow": {"model": {"layers": 2}},
    "wd0.1": {"wd": 0.1},
    "transcript": {"transcript": True},
    "noisy0.5": {"noise": 0.5},
    "positions": {"render": "positions"},
    "local": {"render": "local"},
    "relative": {"render": "relative"},
}
BASE: dict[str, Any] = {
    "action": 1.0,
    "lr": 1e-3,
    "warmup": 50,
    "init": None,
    "untied": False,
    "model": {},
    "wd": 0.01,
    "transcript": False,
    "noise": 0.0,
    "render": "grid",
}


def data(
    history: int | None, noise: float, render: str, episodes: int, seed: int, tokenizer: Any
) -> tuple[list[Sample], list[tuple[Sample, int]]]:
    """Training samples (noisy or not) and held-out expert turns with their action."""
    agent = AgentConfig(think=False, history=history, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    options = {"frozenlake": {"slippery": False, "render": render}}
    cfg = WarmstartConfig(
        envs=("frozenlake",),
        env_options=options,
        demonstrator="expert",
        episodes=episodes,
        agent=agent,
        random_share=noise,
    )
    train = [x for e in demonstrations(cfg, tokenizer, seed) for x in samples(e, tokenizer, actions=True)]
    held = replace(cfg, random_share=0.0, episodes=256)
    test = [
        (x, a[2])
        for e in demonstrations(held, tokenizer, seed + 10**5)
        for x in samples(e, tokenizer, actions=True)
        for a in x.actions[:1]
    ]
    return train, test


def score(model: Any, test: list[tuple[Sample, int]]) -> tuple[float, float]:
    """(mass on the demonstrated action, accuracy) over held-out turns."""
    mass = hits = 0.0
    with torch.no_grad():
        for s, target in test:
            p, firsts, _ = s.actions[0]
            logits = model(input_ids=torch.tensor([s.ids[:p]])).logits[0, -1, list(firsts)]
            probs = torch.softmax(logits.float(), -1)
            mass += float(probs[target])
            hits += float(int(probs.argmax()) == target)
    return mass / len(test), hits / len(test)


def build(settings: dict[str, Any], seed: int) -> tuple[Any, Any]:
    model, tokenizer = embedded_model(
        replace(EmbeddedModel(), **settings["model"], tie_embeddings=not settings["untied"]), seed
    )
    if settings["init"] is not None:
        for _name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=settings["init"])
    return model, tokenizer


def train(name: str, args: argparse.Namespace) -> str:
    settings = dict(BASE)
    for part in name.split("+"):  # levers combine: "positions+untied"
        settings.update(VARIANTS[part])
    torch.manual_seed(args.seed)
    model, tokenizer = build(settings, args.seed)
    history = None if args.history == "full" else int(args.history)
    train_set, test = data(history, settings["noise"], settings["render"], args.episodes, args.seed, tokenizer)
    if settings["transcript"]:
        train_set = [Sample(s.ids, [t if i else -100 for i, t in enumerate(s.ids)], s.actions) for s in train_set]
    opt = torch.optim.AdamW(model.parameters(), lr=settings["lr"], weight_decay=settings["wd"])
    warm = settings["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    g = torch.Generator().manual_seed(args.seed)
    line, t0, reached = [], time.time(), None
    for step in range(args.steps + 1):
        if step % args.every == 0:
            model.eval()
            mass, acc = score(model, test[: args.test])
            model.train()
            line.append(f"{step}:{mass:.2f}/{acc:.2f}")
            if reached is None and acc >= args.target:
                reached = step
        if step == args.steps:
            break
        batch = [train_set[int(i)] for i in torch.randint(len(train_set), (args.batch,), generator=g)]
        loss = sft_loss(model, batch, tokenizer.pad_token_id, settings["action"])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    when = f"acc >= {args.target} at step {reached}" if reached is not None else f"acc < {args.target}"
    return f"| {name} | {' '.join(line)} | {when} | {time.time() - t0:.0f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="plain,action,lr3e-3,untied,wide,transcript,positions")
    ap.add_argument("--history", default="0", help="agent.history: a number, or 'full'")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8, help="samples per step")
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--episodes", type=int, default=1024, help="demonstration episodes")
    ap.add_argument("--test", type=int, default=256, help="held-out turns scored")
    ap.add_argument("--target", type=float, default=0.6, help="accuracy to report the step of")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"history {args.history}, {args.steps} steps x {args.batch} samples; cells: step:mass/accuracy")
    print("| variant | curve | reached | s |\n|---|---|---|---|")
    for name in args.variants.split(","):
        print(train(name, args), flush=True)


if __name__ == "__main__":
    main()
