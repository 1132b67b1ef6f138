"""The pretrain stage: the first policy learns to read the environments' states.

Before the warm start, the model answers questions about states that the
environments generate and answer themselves (`envs.probes`: what each move leads to,
where the player is, where the goal or the nearest box is), asked in the agent's own
prompt (`stages.training.pretrain`). No model and no data set is needed, and the
probes never say which move to make: what the warm start and StarPO then learn about
acting is theirs. A once-stage like the warm start: its key comes from its config
and the base model's, so only the first run pays for it. Its metrics are the
held-out accuracy of each task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from catalog.datasets import Artifact, ArtifactRef
from common.config import ConfigProblem, param
from stages.agent.loop import AgentConfig
from stages.agent.play import EnvOptions, check_env
from stages.registry import StageContext, StageResult, stage

STATE_SEED_BASE = 5 * 10**12
HELD_OUT_SEED_BASE = 6 * 10**12


def held_out_seeds(index: int, count: int) -> list[int]:
    """The seeds of the held-out states of the `index`-th probed environment."""
    return [HELD_OUT_SEED_BASE + index * 10**9 + k for k in range(count)]


@dataclass(frozen=True)
class PretrainConfig:
    """`pretrain:` — probe questions about states, before the warm start."""

    envs: tuple[str, ...] = param(("frozenlake",), "environments whose states are probed (frozenlake, sokoban)")
    env_options: dict[str, EnvOptions] | None = param(None, "options per environment (as the rollout's)")
    states: int = param(
        20000, "states per environment to ask about (each gives every probe; 4,000 let the model memorise)", ge=1
    )
    held_out: int = param(200, "held-out states per environment for the accuracy metrics", ge=1)
    steps: int = param(
        4000, "optimiser steps (a grid's cells are read from about step 2,000: experiments/pretrain.py)", ge=0
    )
    batch_size: int = param(32, "samples (chats) per step", ge=1)
    per_chat: int = param(
        1,
        "probes asked in one chat, one after another (each of a state's probes once): a state's prompt is read "
        "once for that many answers",
        ge=1,
    )
    balance: bool = param(
        False,
        "neighbour answers as often as each other (ice, edge, hole, goal; wall, box, ... in Sokoban): asked one "
        "to a chat, drawn by the inverse of their share; several to a chat, their tokens weighed by it in the "
        "loss. Unbalanced, a lake's answer is ice two times in three and hole one in ten",
    )
    lr: float = param(3e-4, "AdamW learning rate (at 1e-3 the grid's cells were never read)", gt=0)
    schedule: Literal["linear", "constant"] = param(
        "linear", "learning rate: a warm-up over 5% of the steps then a linear decay to 10% (linear), or constant"
    )
    weight_decay: float = param(0.01, "AdamW weight decay", ge=0)
    read_to: float | None = param(
        None,
        "go on past `steps`, `read_block` steps at a time (each block its own warm-up and decay), until the "
        "held-out neighbour accuracy of every environment reaches this, or `read_max` steps in all; none: "
        "exactly `steps` (a seed whose pretraining reads less fails RL more often: docs/performance.md)",
        ge=0,
        le=1,
    )
    read_block: int = param(500, "steps a block past `steps` while the model reads less than `read_to`", ge=1)
    read_max: int = param(8000, "steps in all at most, with `read_to`", ge=1)
    agent: AgentConfig = param(AgentConfig(), "the agent loop's format (the prompt the probes are asked in)")

    def __post_init__(self) -> None:
        from envs.probes import has_probes

        if not self.envs:
            raise ConfigProblem("envs", "expected at least one environment")
        if self.read_to is not None and self.read_max < self.steps:
            raise ConfigProblem(
                "read_max", f"expected at least `steps` ({self.steps}) with `read_to`, got {self.read_max}"
            )
        for name in self.envs:
            if not has_probes(name):
                raise ConfigProblem("envs", f"'{name}' has no probes (frozenlake and sokoban have)")
            check_env("envs", name, (self.env_options or {}).get(name), "env_options")


def _counted(ctx: StageContext, before: int, total: int) -> Callable[[int], None]:
    """`train`'s `on_step` for a block that starts after `before` steps of `total`."""
    return lambda n: ctx.progress(before + n, total, "steps")


def _lowest_read(scores: dict[str, dict[str, float]]) -> float:
    """The lowest held-out neighbour accuracy over the environments that ask it (1 where none does)."""
    return min((by_task["neighbour"] for by_task in scores.values() if "neighbour" in by_task), default=1.0)


@stage(
    "pretrain",
    config=PretrainConfig,
    outputs={"pretrained": Artifact("the policy after probe pretraining (version 0)")},
    metrics={
        "pretrain/*/*": "held-out exact-match accuracy of one probe task of one environment (after training)",
        "pretrain/*/*_before": "the same before training",
        "pretrain/loss": "mean loss of the last 100 steps",
        "pretrain/steps": "optimiser steps taken (more than `steps` where `read_to` asked for more)",
    },
)
def pretrain(ctx: StageContext, cfg: PretrainConfig, base: ArtifactRef) -> StageResult:
    """Train the base policy on probe answers; report per-task held-out accuracy."""
    import torch

    from stages.models.policy import load_policy, save_policy, training_device
    from stages.training.pretrain import accuracy, answer_balance, probe_samples, train
    from stages.training.sft import linear_decay

    model, tokenizer = load_policy(base.local_path(), device=training_device(), dtype="float32")
    pad = tokenizer.pad_token_id
    pairs, held = [], {}
    for i, name in enumerate(cfg.envs):
        options = (cfg.env_options or {}).get(name)
        offset = i * 10**9 + ctx.seed * 10**6
        seeds = [STATE_SEED_BASE + offset + k for k in range(cfg.states)]
        pairs += probe_samples(name, options, seeds, tokenizer, cfg.agent, cfg.per_chat, cfg.balance)
        held[name] = probe_samples(name, options, held_out_seeds(i, cfg.held_out), tokenizer, cfg.agent)
    metrics: dict[str, float] = {}
    for name, data in held.items():
        metrics |= {f"pretrain/{name}/{task}_before": v for task, v in accuracy(model, data, pad).items()}
    torch.manual_seed(ctx.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    t0 = time.time()
    sched = linear_decay(opt, cfg.steps) if cfg.schedule == "linear" else None
    samples = [s for _, s in pairs]
    generator = torch.Generator().manual_seed(ctx.seed)
    odds = answer_balance(pairs) if cfg.balance else None
    losses = train(
        model,
        samples,
        cfg.steps,
        cfg.batch_size,
        opt,
        pad,
        generator,
        sched=sched,
        on_step=_counted(ctx, 0, cfg.steps),
        weights=odds,
    )

    def read() -> dict[str, dict[str, float]]:
        return {name: accuracy(model, data, pad) for name, data in held.items()}

    scores = read()  # the metrics below, and what `read_to` asks of them
    done = cfg.steps
    while cfg.read_to is not None and done < cfg.read_max and _lowest_read(scores) < cfg.read_to:
        block = min(cfg.read_block, cfg.read_max - done)
        ctx.log(f"pretrain: reads less than {cfg.read_to:g} after {done} steps; {block} more")
        losses += train(
            model,
            samples,
            block,
            cfg.batch_size,
            opt,
            pad,
            generator,
            sched=linear_decay(opt, block) if cfg.schedule == "linear" else None,
            on_step=_counted(ctx, done, cfg.read_max),
            weights=odds,
        )
        done += block
        scores = read()
    model.eval()
    for name, by_task in scores.items():
        metrics |= {f"pretrain/{name}/{task}": v for task, v in by_task.items()}
    tail = losses[-100:]
    metrics["pretrain/loss"] = sum(tail) / len(tail) if tail else 0.0
    shown = ", ".join(
        f"{k.split('/', 1)[1]}={v:.2f}" for k, v in metrics.items() if not k.endswith(("_before", "loss"))
    )
    took = f"{len(samples)} chats of {cfg.per_chat} probe(s), {done} steps in {time.time() - t0:.0f}s"
    ctx.log(f"pretrain: {took}; held-out accuracy {shown}")
    metrics["pretrain/steps"] = float(done)
    save_policy(model, tokenizer, ctx.output_dir("pretrained"), version=0, base=base.key, pretrained=True)
    return StageResult(metrics=metrics)
