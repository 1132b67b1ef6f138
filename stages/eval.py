"""The eval stage (docs/method.md#batches-groups-and-seeds, docs/method.md#what-we-measure): success on the fixed validation seeds.

Every environment listed (variants are environments of their own: e.g.
``bandit_heldout``, ``sokoban_new_vocab``) is played from the same validation
seeds (`stages.agent.play.validation_seeds`; environments that hold states out start
every validation episode from a state no training episode can start from,
`envs.base.TextEnv.reset`) at temperature 0.5 by default, with `samples` tries per
seed for pass@k, and with ``greedy: true`` once more per seed at temperature 0
(rows with ``temperature = 0``; metrics ``eval/*/greedy_success_rate``). Rows land in the `evals` view (the
trajectory schema, ``split = 'validation'``; ``policy_version`` tells which
policy was evaluated: 0 is the warm start). Put one eval node ``once`` on the
warm start and one every N iterations on the updated policy (``every: N``; it
also runs after the last iteration).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from catalog.datasets import ArtifactRef, Table
from common.config import ConfigProblem, param
from stages.agent.loop import AgentConfig, check_same_agent
from stages.agent.play import (
    AGENT_METRICS,
    MAX_EPISODES,
    EnvOptions,
    check_env,
    env_data,
    episode_specs,
    max_env_failures_param,
    sample_trajectories,
    validation_seeds,
)
from stages.endpoint.episodes import player
from stages.engines import ENGINES, EngineName, EngineSettings, VLLMSettings
from stages.engines.hosts import ENGINE_METRICS, engine_policy, from_memory
from stages.registry import Neighbours, StageContext, StageResult, engine_claims, stage


@dataclass(frozen=True)
class EvalConfig:
    """`eval:` — what to evaluate on and how."""

    envs: tuple[str, ...] = param(("sokoban",), "environments and variants to evaluate (docs/envs.md)")
    env_options: dict[str, EnvOptions] | None = param(
        None, "options per environment, e.g. {sokoban: {dim_room: [8, 8]}}"
    )
    episodes: int = param(128, "validation seeds per environment (reference: 256)", ge=1)
    samples: int = param(1, "tries per seed; pass@k with k = samples", ge=1)
    temperature: float = param(0.5, "sampling temperature (reference: 0.5; 0: greedy)", ge=0)
    greedy: bool = param(False, "also play each seed once at temperature 0 (rows with temperature 0)")
    max_env_failures: float = max_env_failures_param()
    engine: EngineName = param("hf", "generation engine", choices=ENGINES)
    actors: int = param(
        0,
        "engine actors as rollout.actors (with the same engine and resources, eval shares "
        "the rollout's actors); 0: in this process",
        ge=0,
    )
    actor_cpus: float | None = param(None, "CPUs reserved per actor (as rollout.actor_cpus)", gt=0)
    actor_gpus: float = param(0.0, "GPUs per actor", ge=0)
    max_batch: int | None = param(None, "episodes an engine plays at once (as rollout.max_batch)", ge=0)
    vllm: VLLMSettings = param(VLLMSettings(), "vLLM's own settings (as rollout.vllm)")
    agent: AgentConfig = param(AgentConfig(), "the agent loop; must equal the rollout's")

    def engine_settings(self) -> EngineSettings:
        """The engine fields as one object (`stages.engines.EngineSettings`)."""
        options = self.vllm.options() if self.engine == "vllm" else ()
        return EngineSettings(self.engine, self.actors, self.actor_cpus, self.actor_gpus, self.max_batch, options)

    def __post_init__(self) -> None:
        if not self.envs:
            raise ConfigProblem("envs", "expected at least one environment")
        episodes = self.episodes * self.samples * len(self.envs) * (2 if self.greedy else 1)
        if episodes > MAX_EPISODES:
            raise ConfigProblem(
                "episodes",
                f"episodes x samples x environments{' x 2 (greedy)' if self.greedy else ''} is {episodes:,} "
                f"episodes an eval; at most {MAX_EPISODES:,} fit in one machine's memory",
            )
        for name in self.envs:
            check_env("envs", name, (self.env_options or {}).get(name), "env_options", "validation", self.agent)
        for name in self.env_options or {}:
            if name not in self.envs:
                raise ConfigProblem("env_options", f"options for '{name}', which is not in eval.envs")

    def key_extra(self) -> dict[str, object]:
        """The content of the data files the environments read (`env_data`)."""
        return env_data([(name, (self.env_options or {}).get(name)) for name in self.envs])


def _check(cfg: EvalConfig, pipeline: Neighbours) -> None:
    check_same_agent(cfg.agent, pipeline)


def greedy_metrics(table: pa.Table, envs: tuple[str, ...]) -> dict[str, float]:
    """Success per environment, and their mean, of the greedy (temperature 0) rows."""
    env_col = np.array(table["env"].to_pylist())
    success = table["success"].to_numpy(zero_copy_only=False).astype(float)
    out = {f"eval/{n}/greedy_success_rate": float(success[env_col == n].mean()) for n in envs}
    out["eval/greedy_success_rate"] = float(np.mean([out[f"eval/{n}/greedy_success_rate"] for n in envs]))
    return out


def env_metrics(table: pa.Table, envs: tuple[str, ...], samples: int) -> dict[str, float]:
    """Success (and pass@k) per environment, and their mean."""
    out: dict[str, float] = {}
    env_col = np.array(table["env"].to_pylist())
    success = table["success"].to_numpy(zero_copy_only=False).astype(float)
    seeds = table["seed"].to_numpy()
    for name in envs:
        sel = env_col == name
        out[f"eval/{name}/success_rate"] = float(success[sel].mean())
        if samples > 1:
            passed = [success[sel & (seeds == s)].max() for s in np.unique(seeds[sel])]
            out[f"eval/{name}/pass@{samples}"] = float(np.mean(passed))
    out["eval/success_rate"] = float(np.mean([out[f"eval/{n}/success_rate"] for n in envs]))
    out["eval/format_valid_rate"] = float(table["format_valid_rate"].to_numpy().mean())
    out["eval/score_mean"] = float(table["score"].to_numpy().mean())
    return out


@stage(
    "eval",
    config=EvalConfig,
    outputs={"evals": Table(view="evals")},
    wiring={"policy": "policy"},
    in_memory=from_memory,
    check=_check,
    version=3,
    host=lambda cfg: "engine" if cfg.actors else "driver",
    claims=lambda cfg: engine_claims(cfg.engine_settings()),
    metrics={
        "eval/success_rate": "validation success rate, mean over the evaluated environments",
        "eval/*/success_rate": "validation success rate of one environment",
        "eval/greedy_success_rate": "validation success rate at temperature 0 (`greedy: true`), mean over environments",
        "eval/*/greedy_success_rate": "validation success rate of one environment at temperature 0",
        "eval/*/pass@*": "fraction of validation seeds solved by at least one of k tries",
        "eval/format_valid_rate": "fraction of validation turns in the answer format",
        "eval/score_mean": "mean validation trajectory score",
        **ENGINE_METRICS,
        "eval/env_failures": "episodes dropped because their environment failed (docs/envs.md#serving-environments); "
        "not counted as failures of the policy",
        **{k.replace("rollout/", "eval/"): v for k, v in AGENT_METRICS.items()},
    },
)
def evaluate(ctx: StageContext, cfg: EvalConfig, policy: ArtifactRef) -> StageResult:
    """Play the validation seeds of every listed environment with the policy."""
    t0 = time.time()
    weights = engine_policy(policy, cfg.engine_settings().takes_tensors)

    def play(temperature: float, samples: int) -> tuple[pa.Table, dict[str, float]]:
        specs = [
            s
            for name in cfg.envs
            for s in episode_specs(
                name, (cfg.env_options or {}).get(name), validation_seeds(cfg.episodes), samples, split="validation"
            )
        ]
        return sample_trajectories(
            ctx,
            weights,
            specs,
            cfg.agent,
            cfg.agent.sampling(temperature),
            cfg.engine_settings(),
            failures=("eval/env_failures", cfg.max_env_failures),
            play=player(cfg.agent),
        )

    table, counts = play(cfg.temperature, cfg.samples)
    metrics: dict[str, float] = {**env_metrics(table, cfg.envs, cfg.samples), **counts}
    line = ", ".join(f"{n} {metrics[f'eval/{n}/success_rate']:.1%}" for n in cfg.envs)
    if cfg.greedy and cfg.temperature > 0:
        greedy, more = play(0.0, 1)
        metrics |= greedy_metrics(greedy, cfg.envs)
        metrics |= {k: metrics.get(k, 0.0) + v for k, v in more.items()}
        line += " (greedy: " + ", ".join(f"{metrics[f'eval/{n}/greedy_success_rate']:.1%}" for n in cfg.envs) + ")"
        table = pa.concat_tables([table, greedy])
    ctx.log(f"eval (policy v{table['policy_version'][0]}): {line} in {time.time() - t0:.0f}s")
    return StageResult(tables={"evals": table}, metrics=metrics)
