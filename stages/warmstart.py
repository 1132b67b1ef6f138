"""The warm start: teach the first policy the answer format.

`warmstart` plays demonstration episodes with a scripted policy
(`envs.policies`) through the *same* agent loop as the rollout, so the prompts,
the answer format and the token layout are exactly the rollout's, and fine-tunes
on the demonstrated responses (cross-entropy on the loss-mask tokens). With
``demonstrator: random_valid`` it teaches the format only, so what StarPO gains
later is StarPO's; ``expert`` reproduces the paper's SFT baseline.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pyarrow as pa

import envs
from catalog.datasets import Artifact, ArtifactRef, Table
from catalog.schemas import TRAJECTORY_SCHEMA
from common.config import ConfigProblem, param
from stages.agent import prompts
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, check_same_agent, run_episodes
from stages.agent.play import EnvOptions, PlayJob, check_env, episode_specs, play_batch, trajectory_metrics
from stages.agent.scripted import scripted
from stages.endpoint import chats
from stages.endpoint.rendering import Template
from stages.engines.hosts import EngineHost
from stages.models.lora import settings_of
from stages.models.policy import load_policy, save_policy, training_device
from stages.registry import Neighbours, StageContext, StageResult, stage

DEMO_SEED_BASE = 2 * 10**12
CHECK_SEED_BASE = 3 * 10**12


@dataclass(frozen=True)
class WarmstartConfig:
    """`warmstart:` — supervised fine-tuning on scripted demonstrations."""

    envs: tuple[str, ...] = param(("sokoban",), "environments to demonstrate (names from docs/envs.md)")
    env_options: dict[str, EnvOptions] | None = param(
        None, "options per environment (as the rollout's), e.g. {frozenlake: {slippery: false}}"
    )
    demonstrator: Literal["random_valid", "random_safe", "expert", "none"] = param(
        "random_valid",
        "random_valid: the format only; random_safe: random moves that ruin nothing (FrozenLake: no hole nor the "
        "edge; Sokoban: no bump, no box into a corner; the labels read, the goal left to StarPO); expert: the "
        "paper's SFT baseline; none: no training",
    )
    episodes: int = param(256, "demonstration episodes per environment", ge=1)
    loss_on: Literal["responses", "transcript"] = param(
        "responses",
        "responses: the demonstrated responses only; transcript: every token, the environment's "
        "states too (the model also learns how states follow actions: a world model, no policy)",
    )
    random_share: float = param(
        0.0,
        "probability that a demonstrated action is replaced by a random one (a "
        "noisy expert: a warm start that leaves room for StarPO)",
        ge=0,
        le=1,
    )
    noise: Literal["random_valid", "random_safe"] = param(
        "random_valid",
        "the policy a `random_share` action comes from: random_valid (any action word) or random_safe "
        "(a move that ruins nothing: FrozenLake no hole nor the edge, Sokoban no bump nor a box into a corner; "
        "envs.policies)",
    )
    action_loss: float = param(
        0.0,
        "weight of the cross-entropy over the env's action words at each "
        "demonstrated action token, added to the token loss (0: off). Teaches a "
        "fresh model to choose from the state (experiments/warmstart.py)",
        ge=0,
    )
    demonstrations: str | None = param(
        None,
        "a file of your own transcripts to train on instead of the scripted demonstrations: chat JSON Lines "
        '({"messages": [...]} a line, the OpenAI format, as `pipeline export` writes them) or that Parquet; '
        "trained on their assistant messages. Its content is part of the key, not its path",
        key=False,
    )
    epochs: int = param(3, "passes over the demonstrations", ge=1)
    batch_size: int = param(
        2,
        "samples per optimiser step (episodes; turns with agent.history set); small: many steps for a fresh model",
        ge=1,
    )
    lr: float = param(
        3e-3,
        "peak AdamW learning rate (a fresh embedded model needs a high one; use ~1e-5 for a pretrained checkpoint)",
        gt=0,
    )
    weight_decay: float = param(0.01, "AdamW weight decay", ge=0)
    check_episodes: int = param(
        32, "episodes sampled per environment after training to measure the format rate (0: skip)", ge=0
    )
    agent: AgentConfig = param(AgentConfig(), "the agent loop's budget and format; must equal the rollout's")
    #: the demonstrations' content hash when the spec was checked (set there; not a setting)
    planned: str = field(default="", init=False, repr=False, compare=False, metadata={"key": False})

    def __post_init__(self) -> None:
        if not self.envs:
            raise ConfigProblem("envs", "expected at least one environment")
        for name in self.envs:
            check_env("envs", name, self.options(name), "env_options", "train")
        for name in self.env_options or {}:
            if name not in self.envs:
                raise ConfigProblem("env_options", f"options for '{name}', which is not in warmstart.envs")
        if self.demonstrations is not None:
            try:
                planned, _ = chats.read(self.demonstrations)
            except ValueError as exc:
                raise ConfigProblem("demonstrations", str(exc)) from None
            object.__setattr__(self, "planned", planned)  # what the key holds and the stage must train on

    def options(self, name: str) -> EnvOptions | None:
        return (self.env_options or {}).get(name)

    def key_extra(self) -> dict[str, str]:
        """What the config names but does not hold: the transcripts' content hash, as
        read when the spec was checked (the stage trains on that content or fails)."""
        return {"demonstrations_digest": self.planned} if self.demonstrations else {}


def demonstrations(cfg: WarmstartConfig, tokenizer: Any, seed: int) -> list[Episode]:
    """Play `cfg.episodes` scripted episodes per environment."""
    chat = Chat(tokenizer, cfg.agent.think)
    episodes = []
    for i, name in enumerate(cfg.envs):
        seeds = [DEMO_SEED_BASE + seed * 10**6 + i * 10**5 + k for k in range(cfg.episodes)]
        for spec in episode_specs(name, cfg.options(name), seeds, 1):
            episodes.append(Episode(envs.make(name, **(cfg.options(name) or {})), spec, cfg.agent, chat))
    try:
        return run_episodes(
            episodes, scripted(cfg.demonstrator, tokenizer, cfg.agent.think, seed, cfg.random_share, cfg.noise)
        )
    finally:
        for episode in episodes:
            episode.env.close()


def _same_agent(cfg: WarmstartConfig, pipeline: Neighbours) -> None:
    if cfg.demonstrator != "none" or cfg.check_episodes:  # else the agent loop is not used
        check_same_agent(cfg.agent, pipeline)


@stage(
    "warmstart",
    config=WarmstartConfig,
    check=_same_agent,
    version=2,
    outputs={"policy": Artifact("the warm-started policy (version 0)"), "demonstrations": Table(view="demonstrations")},
    metrics={
        "actor/sft_loss_first": "mean SFT loss of the first epoch",
        "actor/sft_loss": "mean SFT loss of the last epoch",
        "actor/sft_tokens": "demonstrated (loss-mask) tokens per epoch",
        "actor/sft_skipped_turns": "assistant turns of the transcripts not learnt: the template does not extend there",
        "rollout/demo_success_rate": "success rate of the demonstrations",
        "eval/format_valid_rate": "after training: fraction of sampled turns (T=1) in the answer format",
        "eval/success_rate": "after training: success rate of the sampled check episodes",
    },
)
def warmstart(ctx: StageContext, cfg: WarmstartConfig, base: ArtifactRef) -> StageResult:
    """Fine-tune the base policy on scripted demonstrations in the rollout's format."""
    # float32 master weights whatever model.dtype (a bfloat16 AdamW loses most small updates), on a GPU
    # where there is one; the checkpoint keeps model.dtype as the dtype engines load it in
    model, tokenizer = load_policy(base.local_path(), device=training_device(), dtype="float32")
    metrics: dict[str, float] = {}
    demos: list[Episode] = []
    if cfg.demonstrator != "none" or cfg.demonstrations:
        from stages.training.sft import Sample, fine_tune, samples

        if cfg.demonstrations:  # the user's transcripts
            template, prefix = Template(tokenizer), prompts.generation_prefix(cfg.agent.think)
            try:
                _, transcripts = chats.read(cfg.demonstrations, expect=cfg.planned)
            except ValueError as exc:
                raise ConfigProblem("demonstrations", str(exc)) from None
            made = [chats.chat_sample(t, template, prefix) for t in transcripts]
            data = [
                Sample(ids, [t if m or cfg.loss_on == "transcript" else -100 for t, m in zip(ids, mask)], ())
                for ids, mask, _ in made
            ]
            skipped = sum(k for _, _, k in made)
            if skipped:
                ctx.log(f"warm start: {skipped} assistant turn(s) of {cfg.demonstrations} not learnt (template)")
            if not any(label != -100 for d in data for label in d.labels):
                raise ConfigProblem(
                    "demonstrations",
                    f"'{cfg.demonstrations}': no token to learn: the chat template does not extend token-wise at "
                    f"any assistant turn ({skipped} skipped); check the model's template (model.chat_template)",
                )
        else:
            demos = demonstrations(cfg, tokenizer, ctx.seed)
            data = [x for e in demos for x in samples(e, tokenizer, cfg.loss_on == "transcript", cfg.action_loss > 0)]
        t0 = time.time()
        losses = fine_tune(
            model,
            data,
            cfg.epochs,
            cfg.batch_size,
            cfg.lr,
            cfg.weight_decay,
            tokenizer.pad_token_id,
            ctx.seed,
            cfg.action_loss,
            on_step=lambda done, total: ctx.progress(done, total, "steps"),
        )
        ctx.log(
            f"warm start: {len(data)} demonstration samples, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
            f"in {time.time() - t0:.0f}s"
        )
        metrics = {
            "actor/sft_tokens": float(
                sum(sum(e.mask) for e in demos) if demos else sum(sum(x != -100 for x in d.labels) for d in data)
            ),
            "actor/sft_loss_first": losses[0],
            "actor/sft_loss": losses[-1],
        }
        if cfg.demonstrations:
            metrics["actor/sft_skipped_turns"] = float(skipped)
        if demos:
            metrics["rollout/demo_success_rate"] = sum(e.env.success for e in demos) / len(demos)
    lora = settings_of(base.local_path())  # LoRA starts after the warm start, on its weights
    save_policy(
        model,
        tokenizer,
        ctx.output_dir("policy"),
        version=0,
        base=base.key,
        warmstart="transcripts" if cfg.demonstrations else cfg.demonstrator,
        **({"lora": lora} if lora else {}),
    )
    rows = [{**e.row(), "run": ctx.run, "iteration": None} for e in demos]
    if cfg.check_episodes:
        metrics |= _check(ctx, cfg)
    return StageResult(tables={"demonstrations": pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)}, metrics=metrics)


def _check(ctx: StageContext, cfg: WarmstartConfig) -> dict[str, float]:
    """Sample check episodes from the new policy (T=1, in-process) for the format rate."""
    seeds = [CHECK_SEED_BASE + k for k in range(cfg.check_episodes)]
    items = pa.Table.from_pylist(
        [asdict(s) for name in cfg.envs for s in episode_specs(name, cfg.options(name), seeds, 1)]
    )
    sampling = cfg.agent.sampling()
    host = EngineHost("hf")  # not kept: the run's engines live in the rollout's hosts
    table = host.run(ctx.output_dir("policy"), play_batch, items, PlayJob(cfg.agent, sampling, ctx.seed))
    m = trajectory_metrics(table, "")
    return {"eval/format_valid_rate": m["format_valid_rate"], "eval/success_rate": m["success_rate"]}
