"""Playing episodes: the agent loop driven by generation engines, batch by batch.

A Ray Data dataset of episode specs (env, options, seed, group, sample) is mapped
onto engine actors kept for the Ray session (`stages.engines.hosts`); each plays
its block of episodes turn by turn (`play_batch`, `stages.agent.loop`). The
trajectories come back to the driver as Arrow, in the trajectory schema
(`catalog.schemas`). With ``actors: 0`` an engine host in this process plays them,
without Ray. Used by the rollout, eval and warm-start stages.

Seeds (docs/method.md#batches-groups-and-seeds): the trajectories of a group share their
initial-state seed; training seeds move forward every iteration (`train_seeds`),
evaluation uses a fixed set (`validation_seeds`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import envs
from catalog.datasets import GROUPS_KEY, ArtifactRef
from catalog.schemas import TRAJECTORY_SCHEMA
from common.config import ConfigProblem, param
from envs.base import EnvFault
from stages.agent.chat import Chat
from stages.agent.explore import force_answers
from stages.agent.loop import (
    AGENT_FAULT,
    FAULT,
    AgentConfig,
    Episode,
    EpisodeSpec,
    fault_row,
    options_json,
    run_episodes,
)
from stages.engines import Engine, EngineSettings, SamplingParams
from stages.engines.hosts import Policy, Weights, local_host, play_on_ray
from stages.registry import StageContext

OptionValue = int | float | bool | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...] | None
#: the most episodes one rollout or eval may play: their trajectories are held in memory
#: before they are committed (a million 5-turn episodes is about 10 GB)
MAX_EPISODES = 1 << 20

#: an environment's options; one level of mapping for a wrapper's own (`served`: `options`)
EnvOptions = dict[str, OptionValue | dict[str, OptionValue]]


def max_env_failures_param() -> Any:
    """The `max_env_failures` setting of the stages that play episodes (rollout, eval)."""
    return param(
        0.5,
        "share of the stage's episodes whose environment may fail (a served environment's fault, after its "
        "retries: dropped and counted) before the stage fails",
        ge=0,
        le=1,
    )


def check_env(
    field: str,
    name: str,
    options: EnvOptions | None,
    options_field: str = "",
    split: str | None = None,
    agent: AgentConfig | None = None,
) -> None:
    """Raise ConfigProblem unless `name` with `options` makes an environment (naming
    `options_field` when the name is fine but an option is not) from which episodes of
    `split` can start, as far as it can tell without playing (`TextEnv.split_problem`),
    and, given the `agent`, which that agent can play (`TextEnv.program`)."""
    try:
        env = envs.make(name, **(options or {}))
    except envs.EnvError as exc:
        raise ConfigProblem(options_field if options_field and name in envs.names() else field, str(exc)) from None
    if agent is not None and env.program and (agent.program.function != env.program or not agent.program.reward):
        env.close()
        raise ConfigProblem(
            "agent.program",
            f"'{name}' plays its own rollout: set agent.program.function: {env.program}, and a reward "
            "function for its score (see the environment's page in docs/envs.md)",
        )
    try:
        problem = env.split_problem(split) if split is not None else None
    finally:
        env.close()
    if problem is not None:
        raise ConfigProblem(options_field if options_field and options else field, f"{name}: {problem}")


def check_reasoning_rule(name: str, options: EnvOptions | None, agent: AgentConfig) -> None:
    """Raise ConfigProblem at ``agent.reasoning_bonus`` unless the rollout's episodes have
    a thought to judge and the environment a rule to judge it by (`TextEnv.reasoning_holds`)."""
    field = "agent.reasoning_bonus"
    if not agent.think:
        raise ConfigProblem(field, "a bonus for reasoning needs agent.think: true (there is no thought to judge)")
    if agent.program.active:
        raise ConfigProblem(field, "an agent program's calls are not judged: the bonus is for our own loop")
    with envs.make(name, **(options or {})) as env:
        env.reset(0)
        rule = env.reasoning_holds("", env.example_action)
    if rule is None:
        raise ConfigProblem(
            field,
            f"'{name}' with these options has no rule to judge a thought by (the bandit has one with payoffs: true)",
        )


def env_data(envs_and_options: list[tuple[str, EnvOptions | None]]) -> dict[str, object]:
    """What a config that plays these environments adds to its result keys: the content
    hash of the data files they read (`envs.data_digest`: a task-record file), so that an
    edited file is played again; nothing for environments that read none."""
    digests = {name: envs.data_digest(name, options) for name, options in envs_and_options}
    found = {name: d for name, d in digests.items() if d is not None}
    return {"env_data": found} if found else {}


VALIDATION_SEED_BASE = 10**12


def train_seeds(run_seed: int, iteration: int, n_groups: int, offset: int = 0) -> list[int]:
    """Initial-state seeds of an iteration's groups: new states every iteration."""
    base = offset + run_seed * 10**7 + iteration * n_groups
    return [base + g for g in range(n_groups)]


def validation_seeds(n: int) -> list[int]:
    """The fixed validation set (docs/method.md#batches-groups-and-seeds: 256 initial states), the same for every
    run and iteration, and apart from every training seed."""
    return [VALIDATION_SEED_BASE + k for k in range(n)]


def episode_specs(
    env: str, options: EnvOptions | None, seeds: list[int], group_size: int, split: str = "train"
) -> list[EpisodeSpec]:
    """`group_size` episodes per seed; group g plays seeds[g]."""
    opts = options_json(options)
    return [EpisodeSpec(env, opts, seed, g, k, split) for g, seed in enumerate(seeds) for k in range(group_size)]


def _batch_seed(specs: list[EpisodeSpec], base: int, turn: int) -> int:
    text = f"{base}:{specs[0].split}:{specs[0].seed}:{specs[0].group}:{specs[0].sample}:{turn}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


#: episodes an `hf` engine plays at once by default (`max_batch`): one generate call over a
#: larger batch runs every row until the longest is done and costs more per token on CPU
#: (2048 prompts: about half the tokens/s of 16 calls of 128; bench/iteration.py)
HF_MAX_BATCH = 128


@dataclass(frozen=True)
class PlayJob:
    """How an engine host plays a batch of episode specs (`play_batch`): the agent loop,
    the sampling, the step's seed, how many episodes at a time (0: all at once), and
    the share of turns whose answer is forced (`stages.agent.explore`)."""

    agent: AgentConfig
    sampling: SamplingParams
    seed: int
    max_batch: int = 0
    explore: float = 0.0


def play_batch(
    engine: Engine, batch: pa.Table, job: PlayJob, on_done: Callable[[int, int], None] | None = None
) -> pa.Table:
    """Play a batch of episode specs to the end with `engine` (run by an engine host,
    `stages.engines.hosts`); one trajectory row per spec. `on_done(done, total)` is told
    after every turn how many episodes have ended."""
    agent, sampling, seed, max_batch = job.agent, job.sampling, job.seed, job.max_batch
    specs = [EpisodeSpec(**row) for row in batch.to_pylist()]
    size = max_batch or len(specs) or 1
    chat = Chat(engine.tokenizer, agent.think)
    rows = []
    for start in range(0, len(specs), size):
        part = specs[start : start + size]
        played: list[Episode | dict[str, Any]] = []  # an episode, or the row of one whose env failed at once
        for s in part:
            try:
                played.append(Episode(envs.make(s.env, **json.loads(s.options)), s, agent, chat))
            except EnvFault as exc:
                played.append(fault_row(s, exc))
        episodes = [e for e in played if isinstance(e, Episode)]
        turn = 0

        def respond(active: list[Episode]) -> list:
            nonlocal turn
            turn += 1
            if on_done is not None:
                on_done(start + len(part) - len(active), len(specs))
            out = engine.generate([e.prompt for e in active], replace(sampling, seed=_batch_seed(part, seed, turn)))
            if not job.explore:
                return out
            return force_answers(engine, active, out, job.explore, seed, turn, sampling.temperature)

        try:
            run_episodes(episodes, respond)
        finally:
            for e in episodes:  # a served environment's place on its server is freed
                e.env.close()
        rows += [e.row() if isinstance(e, Episode) else e for e in played]
        if on_done is not None:
            on_done(start + len(part), len(specs))
    return pa.Table.from_pylist(rows, schema=_AGENT_SCHEMA)


def episodes_at_once(engine: str, setting: int | None) -> int:
    """Episodes an engine plays at once: the setting, else `HF_MAX_BATCH` for `hf` and
    all of them (0) for vLLM, which schedules its own batches."""
    return setting if setting is not None else (HF_MAX_BATCH if engine == "hf" else 0)


_AGENT_SCHEMA = pa.schema(
    [
        f
        for f in TRAJECTORY_SCHEMA
        if f.name not in ("run", "iteration", "policy_version", "policy_key", "staleness", "temperature")
    ]
)


def sample_trajectories(
    ctx: StageContext,
    policy: Policy,
    specs: list[EpisodeSpec],
    agent: AgentConfig,
    sampling: SamplingParams,
    engine: EngineSettings,
    explore: float = 0.0,
    failures: tuple[str, float] = ("rollout/env_failures", 0.5),
    play: Callable[..., pa.Table] | None = None,
) -> tuple[pa.Table, dict[str, float]]:
    """Play `specs` with the policy: the full trajectory table (rollout and eval), and
    what the engine hosts report (`stages.engines.hosts.ENGINE_METRICS`). `play` plays
    a batch in an engine host: our own loop (`play_batch`, the default), or an agent program through
    the endpoint (`stages.endpoint.episodes.serve_batch`). With
    ``actors: 0`` this process's engine host plays them; otherwise Ray Data maps
    them over the session's host actors (`stages.engines.hosts`). Episodes whose
    environment failed are dropped and counted (`failures`: the metric, and the share
    of episodes past which the stage fails instead; `drop_faults`)."""
    from stages.models.policy import policy_version

    play = play or play_batch
    job = PlayJob(agent, sampling, ctx.step_seed, episodes_at_once(engine.engine, engine.max_batch), explore)
    items = pa.Table.from_pylist([asdict(s) for s in specs])
    if engine.actors == 0:
        host = local_host(engine.engine, engine.options)
        host.counters()
        table = host.run(policy, play, items, job, lambda done, total: ctx.progress(done, total, "episodes"))
        counts = host.counters()
    else:
        ctx.ray()
        table, counts = play_on_ray(items, policy, play, job, engine, getattr(ctx, "place", None))
    if counts.get("perf/engine_restarts"):
        ctx.warn(
            f"{counts['perf/engine_restarts']:g} engine actor(s) died and were restarted by Ray; a call one was "
            "running was played again from the same seeds",
            "perf/engine_restarts",
            counts["perf/engine_restarts"],
        )
    table, counts[failures[0]] = drop_faults(ctx, table, *failures)
    if agent.program.active:
        stage = failures[0].split("/", 1)[0]
        table, counts[f"{stage}/agent_faults"] = drop_faults(ctx, table, f"{stage}/agent_faults", 1.0, AGENT_FAULT)
        drifts = table["drift"].to_numpy(zero_copy_only=False)
        calls = table["num_turns"].to_numpy()
        counts[f"{stage}/drift_tokens"] = float(drifts.sum() / max(1, calls.sum()))
    if isinstance(policy, Weights):
        version = policy.version
    else:
        version = policy_version(policy if isinstance(policy, Path) else policy.stored_path())
    n = table.num_rows
    training = ctx.iteration is not None and all(s.split == "train" for s in specs)
    extra = {
        "run": [ctx.run] * n,
        "iteration": [ctx.iteration] * n,
        "policy_version": [version] * n,
        "policy_key": [policy.key if isinstance(policy, (ArtifactRef, Weights)) else ""] * n,
        # updates between the sampling policy and the one its iteration trains (``policy@prev:k``: k - 1)
        "staleness": [max(0, (ctx.iteration or 0) - version) if training else None] * n,
        "temperature": [sampling.temperature] * n,
    }
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values, type=TRAJECTORY_SCHEMA.field(name).type))
    table = table.sort_by([("group", "ascending"), ("sample", "ascending")])
    planned = {GROUPS_KEY: str(max((s.group for s in specs), default=-1) + 1).encode()}  # slices follow them
    return table.select(TRAJECTORY_SCHEMA.names).cast(TRAJECTORY_SCHEMA.with_metadata(planned)), counts


def drop_faults(
    ctx: StageContext, table: pa.Table, metric: str, most: float, kind: str = FAULT
) -> tuple[pa.Table, float]:
    """The played table without the episodes whose environment failed (`EnvFault`; with
    `kind` ``agent_fault``, whose agent program failed, `stages.endpoint.episodes`), and how
    many those were: a warning (display and events) names the first. More than `most`
    of them (a share of the episodes), or all of them, is not a flaky environment or
    program but a broken one: the stage fails, naming the first."""
    faulted = pc.starts_with(table["end_reason"], kind)
    n = int(pc.sum(faulted).as_py() or 0)
    if not n:
        return table, 0.0
    dropped = table.filter(faulted)
    first = dropped["end_reason"][0].as_py().split(": ", 1)[-1]
    where = "in their environment" if kind == FAULT else "in their agent program"
    if n > most * table.num_rows or n == table.num_rows:
        share = f"more than {most:g} of them" if n > most * table.num_rows else "every one"
        raise RuntimeError(f"{n} of {table.num_rows} episodes failed {where} ({share}); the first: {first}")
    seeds = _per_seed(dropped, table)
    training = all(split == "train" for split in table["split"].to_pylist())
    also = (
        "; their groups train on those left"
        if training
        else "; the rates count the others only, so a version compares with another on the same seeds "
        "only where neither dropped any (the evals view holds each seed's episodes)"
    )
    ctx.warn(
        f"{n} of {table.num_rows} episodes dropped, their {'environment' if kind == FAULT else 'agent program'} "
        f"failed (the first: {first}); "
        f"by seed: {seeds}{also}",
        metric,
        n,
    )
    return table.filter(pc.invert(faulted)), float(n)


def _per_seed(dropped: pa.Table, played: pa.Table, most: int = 8) -> str:
    """Dropped episodes by environment and seed, e.g. ``frozenlake 12: 2 of 4, ...`` (the
    first `most`): long episodes make more calls and fail more often, so which seeds
    lost episodes says whether the rest is still a fair sample."""

    def by_seed(table: pa.Table) -> Counter[tuple[str, int, str]]:
        return Counter(zip(*(table[c].to_pylist() for c in ("env", "seed", "split")), strict=True))

    counts, totals = by_seed(dropped), by_seed(played)
    shown = [f"{env} {seed}: {c} of {totals[(env, seed, split)]}" for (env, seed, split), c in counts.items()]
    more = f", and {len(shown) - most} more seeds" if len(shown) > most else ""
    return ", ".join(shown[:most]) + more


def trajectory_metrics(table: pa.Table, prefix: str) -> dict[str, float]:
    """Batch statistics of a trajectory table under `prefix` (e.g. 'rollout/')."""
    score = table["score"].to_numpy()
    groups = table["group"].to_numpy()
    stds = [float(score[groups == g].std()) for g in np.unique(groups)]
    turns = table["turns"].to_pylist()
    valid = [v for traj in turns for t in traj for v in t["valid"]]
    return {
        f"{prefix}score_mean": float(score.mean()),
        f"{prefix}score_std": float(score.std()),
        f"{prefix}in_group_std": float(np.mean(stds)),
        f"{prefix}success_rate": float(table["success"].to_numpy(zero_copy_only=False).mean()),
        f"{prefix}format_valid_rate": float(table["format_valid_rate"].to_numpy().mean()),
        f"{prefix}action_valid_rate": float(np.mean(valid)) if valid else 0.0,
        f"{prefix}turns_mean": float(table["num_turns"].to_numpy().mean()),
        f"{prefix}actions_mean": float(table["num_actions"].to_numpy().mean()),
        f"{prefix}response_tokens_mean": float(table["response_tokens"].to_numpy().mean()),
        f"{prefix}truncated_context_rate": float(table["truncated_context"].to_numpy(zero_copy_only=False).mean()),
        f"{prefix}truncated_response_rate": float(table["truncated_response"].to_numpy(zero_copy_only=False).mean()),
    }


#: what agent mode (``agent.program``, docs/agents.md) adds to a stage's metrics (``eval/`` for the eval)
AGENT_METRICS = {
    "rollout/agent_faults": "episodes dropped because their agent program failed (raised, ran past its time, "
    "made no call, sent a malformed request, or left no reward); never trained on",
    "rollout/drift_tokens": "per call, the tokens by which the answer re-rendered through the chat template "
    "differs from the sampled one (recorded, never trained on: the sampled tokens are)",
}

TRAJECTORY_METRICS = {
    "score_mean": "mean trajectory score (sum of turn rewards incl. format penalties)",
    "score_std": "std of trajectory scores over the batch",
    "in_group_std": "mean over groups of the std of scores inside the group",
    "success_rate": "fraction of trajectories whose environment reported success",
    "format_valid_rate": "fraction of turns whose answer parsed with only valid actions",
    "action_valid_rate": "fraction of parsed actions that are valid action words",
    "turns_mean": "turns per trajectory",
    "actions_mean": "actions executed per trajectory",
    "response_tokens_mean": "sampled tokens per trajectory",
    "truncated_context_rate": "fraction of trajectories ended by max_context",
    "truncated_response_rate": "fraction of trajectories with a response cut at max_new_tokens",
}
