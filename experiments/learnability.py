"""Learnability: how fast the embedded policy learns to read a FrozenLake state, from
labels and from a per-decision reward, measured on the rollout's own prompts.

The default run's learning target depends on this. Each sample is the first-turn
prompt of a deterministic lake (exactly the tokens the rollout would feed the model,
think off, one action per turn), after 0-3 random safe steps. An action is *good*
when it stays on the lake, avoids holes and brings the player closer to the goal. The
score is the policy's probability mass on the good actions (renormalised over the four
action words), on 256 held-out states; a policy that cannot read the grid sits at
the mean share of good actions (about 0.36 on 4x4).

- supervised: cross-entropy onto the set of good actions (a perfect label per state);
- decision-rl: REINFORCE on the same states, one sampled action per state, reward 1
  when it is good, advantages normalised over the batch. This is RL with exact credit
  for every decision; the pipeline's rollouts give one reward per *trajectory*.

Both start from the same freshly built embedded model. Prints the score every
`--every` steps and, per method, the steps and seconds to reach `--target`.

    python experiments/learnability.py [--size 4] [--steps 200] [--target 0.55]   # ~8 min on 2 cores

Its siblings measure what made the default learn: `experiments/warmstart.py` (warm-start
objectives, renderings and model levers on the warm start's own samples),
`experiments/pretrain.py` (probe pretraining, then the warm start on top),
`experiments/comparators.py` (the scripted rules a policy must beat) and
`experiments/levers.py` (RL levers: whole pipeline runs of the default with overrides).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import envs
from envs.frozenlake import MOVES, move
from stages.agent import prompts
from stages.agent.chat import Chat
from stages.agent.corpus import embedded_model, embedded_tokenizer
from stages.agent.loop import AgentConfig
from stages.models.policy import EmbeddedModel

Sample = tuple[list[int], list[int]]  # prompt ids, indices of the good actions


def sample(seed: int, size: int, chat: Chat) -> Sample | None:
    """A first-turn prompt after 0-3 random safe steps, and its good actions."""
    env = envs.make("frozenlake", slippery=False, size=size)
    env.reset(seed)
    rng = random.Random(seed)
    for _ in range(rng.randint(0, 3)):
        lands = {a: move(env.pos, a, size) for a in MOVES}
        ok = [a for a, p in lands.items() if p != env.pos and p not in env.holes and p != env.goal]
        if not ok:
            break
        env.step(rng.choice(ok))
    turn = prompts.turn_message(
        1, env.render(), env.budget.max_actions_per_traj, think=False, max_new_tokens=AgentConfig().max_new_tokens
    )
    ids = chat.first(prompts.first_message(env, 1) + turn)

    def dist(p: tuple[int, int]) -> int:
        return abs(p[0] - env.goal[0]) + abs(p[1] - env.goal[1])

    lands = {a: move(env.pos, a, size) for a in MOVES}
    good = [
        i
        for i, a in enumerate(MOVES)
        if lands[a] != env.pos and lands[a] not in env.holes and dist(lands[a]) < dist(env.pos)
    ]
    return (ids, good) if good else None


def action_logprobs(model: Any, items: list[Sample], pad: int, action_ids: list[int]) -> torch.Tensor:
    """log p of each action word's token at the end of each prompt, renormalised over the four."""
    width = max(len(ids) for ids, _ in items)
    ids = torch.tensor([[pad] * (width - len(x)) + x for x, _ in items])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x, _ in items])
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -1, action_ids]
    return torch.log_softmax(logits, dim=-1)


def train(method: str, args: argparse.Namespace, data: list[Sample], test: list[Sample]) -> None:
    model, tokenizer = embedded_model(EmbeddedModel(), seed=0)
    action_ids = [tokenizer.encode(a, add_special_tokens=False)[0] for a in MOVES]
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng, batch = random.Random(1), args.batch if method == "supervised" else args.rl_batch
    t0, reached = time.time(), None

    def score() -> float:
        with torch.no_grad():
            p = action_logprobs(model, test, pad, action_ids).exp()
        return sum(p[i, good].sum().item() for i, (_, good) in enumerate(test)) / len(test)

    line = []
    for step in range(args.steps + 1):
        if step % args.every == 0:
            s = score()
            line.append(f"{step}:{s:.2f}")
            if reached is None and s >= args.target:
                reached = (step, time.time() - t0)
        if step == args.steps:
            break
        items = rng.sample(data, batch)
        lp = action_logprobs(model, items, pad, action_ids)
        if method == "supervised":
            loss = -torch.stack([torch.logsumexp(lp[i, good], 0) for i, (_, good) in enumerate(items)]).mean()
        else:
            with torch.no_grad():
                acts = torch.multinomial(lp.exp(), 1).squeeze(1)
                r = torch.tensor([float(int(a) in good) for a, (_, good) in zip(acts, items)])
                adv = (r - r.mean()) / (r.std() + 1e-6)
            loss = -(adv * lp[torch.arange(batch), acts]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    done = (
        f"reached {args.target} at step {reached[0]} ({reached[0] * batch} samples, {reached[1]:.0f}s)"
        if reached
        else f"did not reach {args.target}"
    )
    print(f"{method:<11} batch {batch:>3}: {' '.join(line)}\n{'':<11} {done}; {time.time() - t0:.0f}s in all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4, help="lake size")
    ap.add_argument("--steps", type=int, default=200, help="optimiser steps per method")
    ap.add_argument("--batch", type=int, default=32, help="supervised batch (states)")
    ap.add_argument("--rl-batch", type=int, default=128, help="decision-rl batch (sampled actions)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=25, help="evaluate every N steps")
    ap.add_argument("--target", type=float, default=0.55, help="good-action mass to report the time to")
    ap.add_argument("--methods", default="supervised,decision-rl")
    args = ap.parse_args()
    torch.manual_seed(0)
    chat = Chat(embedded_tokenizer(EmbeddedModel().vocab_size), think=False)
    data = [x for s in range(8000) if (x := sample(s, args.size, chat))]
    test = [x for s in range(256) if (x := sample(10**7 + s, args.size, chat))]
    chance = sum(len(good) for _, good in test) / (4 * len(test))
    print(
        f"{args.size}x{args.size} lake, {len(data)} training states, prompt ~{len(test[0][0])} tokens; "
        f"a blind policy scores {chance:.2f}"
    )
    for method in args.methods.split(","):
        train(method, args, data, test)


if __name__ == "__main__":
    main()
