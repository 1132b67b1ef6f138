"""Probe pretraining levers: how fast a fresh embedded model learns to read a state.

Each variant builds a fresh model, trains it on probe answers (`stages.training.pretrain`,
the `pretrain` stage's own samples: questions about states asked in the agent's
first-turn prompt) for `--steps` steps, and prints the held-out exact-match
accuracy of every task every `--every` steps (a neighbour probe per answer:
`neighbour:hole` is read from the cell, `edge` from the position alone). With
`--warmstart N`, the model then goes through N steps of the warm start's objective
(`experiments/warmstart.py`: noise-free expert demonstrations, action-word loss, at
`--warm-lr`) and the held-out expert-move mass/accuracy is printed: what the `grid`
warm start gains from pretraining. The default compares the `pretrain` stage's
settings (`stage`) with the same warm start and no pretraining (`stage+skip`);
about 22 minutes.

    python experiments/pretrain.py                                       # grid FrozenLake, with and without pretraining
    python experiments/pretrain.py --variants untied+init0.05+lr3e-3 --steps 3000 --warmstart 600
    python experiments/pretrain.py --variants stage --tasks neighbour    # one task alone
    python experiments/pretrain.py --env sokoban --render ''
    python experiments/pretrain.py --variants stage+chat6+batch16 --steps 1500 --every 500   # six probes a chat
    python experiments/pretrain.py --variants stage+batch8+balance --steps 6000 --every 1000 --warmstart 0
    python experiments/pretrain.py --catalog pipeline-data --read starpo   # what a run's pretraining reads

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

from common.recording import Recorder, run_script
from stages.agent.loop import AgentConfig
from stages.training.pretrain import accuracy, answer_balance, probe_samples, train
from stages.training.sft import linear_decay

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warmstart as ws

VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "lr3e-3": {"lr": 3e-3},
    "lr3e-4": {"lr": 3e-4},
    "lr6e-4": {"lr": 6e-4},
    "lr1e-3": {"lr": 1e-3},
    "untied": {"untied": True},
    "init0.05": {"init": 0.05},
    "wide": {"model": {"hidden_size": 256, "intermediate_size": 768}},
    "deep": {"model": {"layers": 8}},
    "shallow": {"model": {"layers": 2}},
    "narrow": {"model": {"hidden_size": 64, "intermediate_size": 192, "heads": 2, "kv_heads": 1}},
    "batch32": {"batch": 32},
    "batch16": {"batch": 16},
    "batch8": {"batch": 8},
    "batch4": {"batch": 4},
    "decay": {"decay": True},
    # the pretrain stage's defaults (stages/pretrain.py; the model's: configs/starpo.yaml)
    "stage": {"untied": True, "init": 0.05, "batch": 32, "lr": 3e-4, "decay": True},
    "skip": {"skip": True},  # no pretraining: the warm start alone
    "chat3": {"per_chat": 3},  # three probes of a state in one chat (the stage's per_chat)
    "chat6": {"per_chat": 6},  # every probe of a lake state in one chat
    "balance": {"balance": True},  # neighbour answers as often as each other (drawn so, or weighed in the loss)
}
BASE: dict[str, Any] = {
    **ws.BASE,
    "lr": 1e-3,
    "batch": 16,
    "decay": False,
    "skip": False,
    "per_chat": 1,
    "balance": False,
}


def _labelled(task: str, sample: Any, tokenizer: Any) -> str:
    """A neighbour probe's task with its answer (`neighbour:hole`): whether the model reads
    the cell (hole, goal) or only where it is (edge, and ice, the most common answer)."""
    if task != "neighbour":
        return task
    answer = tokenizer.decode([t for t in sample.labels if t != -100])
    return f"{task}:{answer.split('<', 1)[0].strip()}"


def run(name: str, args: argparse.Namespace) -> str:
    settings = dict(BASE)
    for part in name.split("+"):
        settings.update(VARIANTS[part])
    torch.manual_seed(args.seed)
    model, tokenizer = ws.build(settings, args.seed)
    agent = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    options = {"slippery": False, "render": args.render} if args.env == "frozenlake" else None
    seeds = list(range(5 * 10**12, 5 * 10**12 + args.states))
    wanted = set(args.tasks.split(",")) if args.tasks else None
    chats = probe_samples(args.env, options, seeds, tokenizer, agent, settings["per_chat"], settings["balance"])
    chats = [(t, s) for t, s in chats if not wanted or set(t.split("+")) <= wanted]
    samples = [s for _, s in chats]
    weights = answer_balance(chats) if settings["balance"] else None
    held = probe_samples(args.env, options, list(range(6 * 10**12, 6 * 10**12 + 200)), tokenizer, agent)
    held = [(_labelled(t, s, tokenizer), s) for t, s in held if not wanted or t in wanted]
    opt = torch.optim.AdamW(model.parameters(), lr=settings["lr"], weight_decay=settings["wd"])
    steps = 0 if settings["skip"] else args.steps
    sched = linear_decay(opt, steps) if settings["decay"] else None
    g = torch.Generator().manual_seed(args.seed)
    cells, t0 = [], time.time()
    for step in range(args.every, steps + 1, args.every):
        train(
            model, samples, args.every, settings["batch"], opt, tokenizer.pad_token_id, g, sched=sched, weights=weights
        )
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
    opt = torch.optim.AdamW(model.parameters(), lr=args.warm_lr, weight_decay=0.01)
    sched = linear_decay(opt, args.warmstart) if settings["decay"] else None
    g = torch.Generator().manual_seed(args.seed)
    every = max(1, args.warmstart // 3)
    line = []
    for step in range(0, args.warmstart + 1, every):
        if step:
            train(model, train_set, every, 8, opt, tokenizer.pad_token_id, g, action_weight=1.0, sched=sched)
        model.eval()
        mass, acc = ws.score(model, test[:256])
        line.append(f"{step}:{mass:.2f}/{acc:.2f}")
    return " ".join(line)


def read(catalog: str, runs: list[str]) -> None:
    """The held-out accuracy of each probe task, neighbour answers apart, of the policy
    each run's `pretrain` stage made (the stage's own held-out states): whether a run's
    pretraining reads a hole next to the player, which its `pretrain/frozenlake/neighbour`
    metric, `ice` two times in three, does not show."""
    from catalog.query import query
    from catalog.store import existing_catalog
    from stages.models.policy import load_policy
    from stages.pretrain import held_out_seeds

    cat = existing_catalog(catalog)
    agent = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    options = {"slippery": False, "render": "grid"}
    print("| run | pretrain | " + " | ".join(READ) + " |\n" + "|---" * (len(READ) + 2) + "|")
    for run in runs:
        name = run.replace("'", "")  # a run name never holds a quote: keep it out of the SQL
        rows = query(cat, f"select key from steps where run = '{name}' and node = 'pretrain'").to_pylist()
        if not rows:
            print(f"| {run} | no pretrain step | " + " | ".join("" for _ in READ) + " |")
            continue
        key = rows[0]["key"]
        model, tokenizer = load_policy(cat.ref(key, "pretrained").local_path())
        held = probe_samples("frozenlake", options, held_out_seeds(0, 200), tokenizer, agent)
        acc = accuracy(model, [(_labelled(t, s, tokenizer), s) for t, s in held], tokenizer.pad_token_id)
        print(f"| {run} | {key} | " + " | ".join(f"{acc.get(t, float('nan')):.2f}" for t in READ) + " |")


#: the columns of `--read`
READ = ("neighbour:hole", "neighbour:goal", "neighbour:ice", "neighbour:edge", "position", "goal_offset")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="stage+skip,stage")
    ap.add_argument("--env", default="frozenlake")
    ap.add_argument("--render", default="grid")
    ap.add_argument("--states", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--every", type=int, default=2000)
    ap.add_argument("--warmstart", type=int, default=900, help="warm-start steps after pretraining (FrozenLake)")
    ap.add_argument("--warm-lr", type=float, default=3e-4, help="the warm start's learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", default="", help="only these probe tasks (comma-separated; default all)")
    ap.add_argument("--read", default="", help="runs (comma-separated) whose pretrained policy to read, instead")
    ap.add_argument("--catalog", default="pipeline-data", help="the catalog of --read's runs")
    ap.add_argument("--save", default=None, help="keep what is printed in experiments/results/NAME.json")
    args = ap.parse_args()
    if args.read:
        read(args.catalog, [r.strip() for r in args.read.split(",") if r.strip()])
        return
    out = Recorder()
    out.line(f"{args.env} render={args.render!r}: {args.steps} steps; cells: step:accuracy per task")
    head = "| variant | tasks | curve | s" + (" | warm start step:mass/accuracy" if args.warmstart else "") + " |"
    out.line(head)
    out.line("|---" * (head.count("|") - 1) + "|")
    for name in args.variants.split(","):
        out.line(run(name, args))
    if args.save:
        out.save(args.save)


if __name__ == "__main__":
    run_script(main)
