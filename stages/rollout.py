"""The rollout stage: agents acting in environments, every sampled token kept.

The episodes are played by `stages.agent.play` (engine actors driven by Ray Data,
or one engine in this process with ``actors: 0``) and committed as one Parquet
table (`trajectories` view; columns in `catalog.schemas`).

Online-k (docs/method.md#rollout-shaping-and-online-k): with ``online_k: k`` the stage has period k
(`stages.registry`): it runs at iterations 0, k, 2k, ... and plays the groups of
those k iterations at once (the same initial states k = 1 would play), group-major,
so that iteration i reads slice i mod k of the table; the other iterations re-use
the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

import envs
from catalog.datasets import ArtifactRef, Table
from common.config import ConfigProblem, param
from stages.agent.explore import unexplored
from stages.agent.loop import AgentConfig
from stages.agent.play import (
    AGENT_METRICS,
    MAX_EPISODES,
    TRAJECTORY_METRICS,
    EnvOptions,
    check_env,
    check_reasoning_rule,
    env_data,
    episode_specs,
    max_env_failures_param,
    sample_trajectories,
    train_seeds,
    trajectory_metrics,
)
from stages.endpoint.episodes import player
from stages.engines import ENGINES, EngineName, EngineSettings, SamplingParams, VLLMSettings
from stages.engines.hosts import ENGINE_METRICS, engine_policy, from_memory
from stages.registry import StageContext, StageResult, engine_claims, stage
from stages.rl.collapse import COLLAPSE_METRICS, collapse_metrics


@dataclass(frozen=True)
class RolloutConfig:
    """`rollout:` — what to play and how to sample."""

    env: str = param("sokoban", "environment name (see docs/envs.md)")
    env_options: EnvOptions | None = param(None, "options of the environment, e.g. {dim_room: [8, 8]}")
    n_groups: int = param(8, "groups per batch; groups differ in initial state (reference: 8)", ge=1)
    group_size: int = param(16, "trajectories per group, sharing one initial state (reference: 16)", ge=1)
    temperature: float = param(1.0, "sampling temperature (0: greedy)", ge=0)
    top_p: float = param(1.0, "nucleus sampling mass (1: off; keep off for training rollouts)", gt=0, le=1)
    top_k: int = param(0, "top-k sampling (0: off; keep off for training rollouts)", ge=0)
    engine: EngineName = param("hf", "generation engine", choices=ENGINES)
    actors: int = param(
        1,
        "engine actors, kept for the Ray session and driven by Ray Data (one per GPU on a "
        "cluster); 0: play in this process, without Ray",
        ge=0,
    )
    actor_cpus: float | None = param(
        None,
        "CPUs reserved per actor (unset: none reserved, the node's CPUs shared among the actors as torch threads)",
        gt=0,
    )
    actor_gpus: float = param(0.0, "GPUs per actor", ge=0)
    max_batch: int | None = param(
        None,
        "episodes an engine plays at once, one generate call per turn over them "
        "(unset: 128 for hf, all of an actor's for vllm; 0: all)",
        ge=0,
    )
    vllm: VLLMSettings = param(VLLMSettings(), "vLLM's own settings, with engine: vllm on a GPU")
    seed_offset: int = param(0, "added to every training seed (a different stream of initial states)", ge=0)
    online_k: int = param(
        1,
        "Online-k (docs/method.md#rollout-shaping-and-online-k): one rollout serves k consecutive updates; it plays k x n_groups "
        "groups every k iterations and iteration i trains on its own n_groups (slice i mod k, "
        "off-policy by up to k-1 updates: the ratio uses the stored sampling log-probs)",
        ge=1,
    )
    explore: float = param(
        0.0,
        "share of turns whose answer is one action word drawn uniformly instead of the sampled response, "
        "trained as if sampled (docs/method.md#exploration-where-the-policy-is-sure; needs engine hf and an "
        "environment with action words); 0: off",
        ge=0,
        le=1,
    )
    max_env_failures: float = max_env_failures_param()
    agent: AgentConfig = param(AgentConfig(), "turn and action budget, format and lengths")

    def __post_init__(self) -> None:
        check_env("env", self.env, self.env_options, "env_options", "train", self.agent)
        episodes = self.n_groups * self.group_size * self.online_k
        if episodes > MAX_EPISODES:
            raise ConfigProblem(
                "n_groups",
                f"n_groups x group_size x online_k is {episodes:,} episodes a rollout; at most {MAX_EPISODES:,} "
                "fit in one machine's memory",
            )
        if self.agent.reasoning_bonus:
            check_reasoning_rule(self.env, self.env_options, self.agent)
        if self.explore > 0:
            if self.agent.program.active:
                raise ConfigProblem("explore", "forced answers are for our own loop, not an agent program's calls")
            if self.engine != "hf":
                raise ConfigProblem("explore", f"forced answers are scored by the hf engine, not '{self.engine}'")
            with envs.make(self.env, **(self.env_options or {})) as env:
                words = env.action_words
            if not words:
                raise ConfigProblem("explore", f"'{self.env}' takes free-form actions: there is no action word to draw")

    def engine_settings(self) -> EngineSettings:
        """The engine fields as one object (`stages.engines.EngineSettings`)."""
        options = self.vllm.options() if self.engine == "vllm" else ()
        return EngineSettings(self.engine, self.actors, self.actor_cpus, self.actor_gpus, self.max_batch, options)

    def sampling(self) -> SamplingParams:
        return self.agent.sampling(self.temperature, self.top_p, self.top_k)

    def key_extra(self) -> dict[str, object]:
        """The content of the data files the environment reads (`env_data`)."""
        return env_data([(self.env, self.env_options)])


@stage(
    "rollout",
    config=RolloutConfig,
    outputs={"trajectories": Table(view="trajectories")},
    wiring={"policy": "policy@prev"},
    in_memory=from_memory,
    version=2,
    period=lambda cfg: cfg.online_k,
    host=lambda cfg: "engine" if cfg.actors else "driver",
    claims=lambda cfg: engine_claims(cfg.engine_settings()),
    metrics={
        **{f"rollout/{k}": v for k, v in TRAJECTORY_METRICS.items()},
        **COLLAPSE_METRICS,
        "rollout/sampled_tokens": "tokens sampled in the stage",
        "rollout/explored_turn_rate": "share of turns whose answer was forced (`explore`)",
        "perf/rollout_tokens_per_s": "sampled tokens per second of the whole stage",
        **ENGINE_METRICS,
        "rollout/env_failures": "episodes dropped because their environment failed (a served environment's fault "
        "after its retries; docs/envs.md#serving-environments); never trained on",
        **AGENT_METRICS,
    },
)
def rollout(ctx: StageContext, cfg: RolloutConfig, policy: ArtifactRef) -> StageResult:
    """Play n_groups x group_size episodes with the policy; keep every token."""
    t0 = time.time()
    first = ctx.iteration or 0
    seeds = [
        s for i in range(first, first + cfg.online_k) for s in train_seeds(ctx.seed, i, cfg.n_groups, cfg.seed_offset)
    ]
    specs = episode_specs(cfg.env, cfg.env_options, seeds, cfg.group_size)
    table, counts = sample_trajectories(
        ctx,
        engine_policy(policy, cfg.engine_settings().takes_tensors),
        specs,
        cfg.agent,
        cfg.sampling(),
        cfg.engine_settings(),
        cfg.explore,
        ("rollout/env_failures", cfg.max_env_failures),
        player(cfg.agent),
    )
    explored = int(pc.sum(pc.list_value_length(table["explored_turns"])).as_py() or 0)
    tokens = int(pc.sum(table["response_tokens"]).as_py() or 0)
    metrics: dict[str, Any] = trajectory_metrics(table, "rollout/") | collapse_metrics(unexplored(table))
    turns = int(pc.sum(table["num_turns"]).as_py() or 0)
    metrics |= {"rollout/explored_turn_rate": explored / max(turns, 1)}
    metrics |= {"rollout/sampled_tokens": tokens, "perf/rollout_tokens_per_s": tokens / (time.time() - t0), **counts}
    return StageResult(tables={"trajectories": table}, metrics=metrics)
