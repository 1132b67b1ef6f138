"""The advantage stage (docs/method.md#the-update-starpo): scores -> normalised rewards -> token advantages.

Reads the (filtered) trajectories and, for the critic-based estimators, the
critic of the previous iteration; writes the batch the update trains on: the
trajectories' training columns plus ``advantages`` (and ``values`` / ``returns``
with a critic), one float per token, zero off the loss mask. It stores only what
it adds (and the row numbers into the kept trajectories: a `Selection`), so the
token lists are never written twice. The maths is in `stages.rl.estimators`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from catalog.datasets import ArtifactRef, Selection, Table, TableRef
from common.config import ConfigProblem, param
from stages.agent.explore import read_explored
from stages.registry import Neighbours, StageContext, StageResult, stage
from stages.rl.registry import ESTIMATORS, METHODS, Estimator, Normalization

BATCH_COLUMNS = (
    "run",
    "iteration",
    "policy_version",
    "env",
    "seed",
    "group",
    "sample",
    "temperature",
    "token_ids",
    "loss_mask",
    "logprobs",
    "score",
    "segments",
)
TOKEN_FLOATS = pa.list_(pa.float32())


@dataclass(frozen=True)
class AdvantageConfig:
    """`advantage:` — reward normalisation and the advantage estimator."""

    estimator: Estimator = param(
        "gae", "the advantage estimator (with a critic: add the critic nodes)", choices=ESTIMATORS
    )
    grouping: Literal["state", "batch", "none"] = param(
        "state", "normalise scores per group (state), over the batch, or not at all"
    )
    method: Normalization = param("identity", "how scores are normalised (docs/method.md)", choices=METHODS)
    turn_rewards: bool = param(
        False, "each turn's reward on its last token instead of the score on the trajectory's last token"
    )
    gamma: float = param(1.0, "token-level discount (reference: 1)", ge=0, le=1)
    lam: float = param(1.0, "token-level GAE lambda (reference: 1)", ge=0, le=1)
    turn_gamma: float = param(0.95, "bi_level_gae and gigpo: turn-level discount (reference: 0.95)", ge=0, le=1)
    turn_lam: float = param(1.0, "bi_level_gae: turn-level lambda", ge=0, le=1)
    step_weight: float = param(1.0, "gigpo: weight of the step-level advantage (GiGPO: 1)", ge=0)
    explored: Literal["better", "all"] = param(
        "better",
        "turns whose answer `rollout.explore` forced: better trains only those whose advantage is positive (a "
        "drawn move that did worse than the policy's own says nothing of the policy's moves, and pushing a "
        "word the policy never says further down shifts every state); all: every one, like a sampled turn",
    )
    micro_batch_size: int = param(8, "trajectories per critic forward pass", ge=1, key=False)


def _check(cfg: AdvantageConfig, pipeline: Neighbours) -> None:
    rollout = pipeline.upstream("rollout")
    if rollout is not None and rollout.group_size < 2:
        if ESTIMATORS.needs(cfg.estimator, "groups"):
            raise ConfigProblem(
                "estimator",
                f"'{cfg.estimator}' compares the trajectories of a group, but "
                "rollout.group_size is 1: use gae or group_size >= 2",
            )
        if cfg.grouping == "state" and cfg.method != "identity":
            raise ConfigProblem(
                "grouping",
                f"normalising per group ({cfg.method}) with rollout.group_size 1 "
                "zeroes every score: use grouping: batch or none",
            )
    if ESTIMATORS.needs(cfg.estimator, "critic") and not pipeline.wired("critic"):
        raise ConfigProblem(
            "estimator",
            f"'{cfg.estimator}' needs a critic: add the nodes "
            "'critic_init: {stage: critic.init, once: true}' and "
            "'critic: {stage: critic.update}', or use grpo / rloo / reinforce_pp",
        )


def compute(table: pa.Table, cfg: AdvantageConfig, critic: ArtifactRef | None) -> tuple[pa.Table, dict[str, float]]:
    """The batch table (module docstring) and the adv/ metrics."""
    import torch

    from stages.models.batching import lengths, padded, unpadded
    from stages.rl.estimators import AdvantageBatch, Discount, normalize_scores, token_rewards

    if table.num_rows == 0:  # the filter left nothing: an empty batch, the update keeps the policy
        out = table.select(list(BATCH_COLUMNS)).append_column("norm_score", pa.array([], pa.float64()))
        for name in ("advantages", "values", "returns"):
            out = out.append_column(name, pa.array([], TOKEN_FLOATS))
        return out, {}
    rows = torch.arange(table.num_rows).numpy()
    t = padded(table, rows, {"loss_mask": torch.long})
    mask = t["loss_mask"]
    scores = torch.from_numpy(table["score"].to_numpy().astype(np.float32))
    groups = torch.from_numpy(table["group"].to_numpy().astype(np.int64))
    norm = normalize_scores(scores, groups, cfg.grouping, cfg.method)
    states = turns = None
    if cfg.turn_rewards or ESTIMATORS.needs(cfg.estimator, "turns"):
        played = table["turns"].to_pylist()
        states = [[t["state"] for t in traj] for traj in played]
        turns = [[t["reward"] for t in traj] for traj in played]
    values = _values(table, critic, cfg.micro_batch_size) if ESTIMATORS.needs(cfg.estimator, "critic") else None
    rewards = token_rewards(mask, scores, norm, turns if cfg.turn_rewards else None)
    batch = AdvantageBatch(norm, groups, mask, rewards, values, states, turns)
    discount = Discount(cfg.gamma, cfg.lam, cfg.turn_gamma, cfg.turn_lam, cfg.step_weight)
    adv, returns = ESTIMATORS[cfg.estimator](batch, discount)
    dropped = 0
    if cfg.explored == "better" and "explored_turns" in table.column_names:
        adv, dropped = keep_better_explored(adv, mask, table["explored_turns"].to_pylist())
    out = table.select(list(BATCH_COLUMNS)).append_column("norm_score", pa.array(norm.numpy(), pa.float64()))
    sizes = lengths(table)

    def column(x: torch.Tensor | None) -> pa.Array:
        return pa.nulls(table.num_rows, TOKEN_FLOATS) if x is None else unpadded(x, sizes, TOKEN_FLOATS)

    out = out.append_column("advantages", column(adv * mask))
    out = out.append_column("values", column(values * mask if values is not None else None))
    out = out.append_column("returns", column(returns))
    m = mask.bool()
    metrics = {
        "adv/mean": float(adv[m].mean()),
        "adv/std": float(adv[m].std(unbiased=False)),
        "adv/abs_max": float(adv[m].abs().max()),
        "adv/norm_score_mean": float(norm.mean()),
        "adv/norm_score_std": float(norm.std(unbiased=False)),
        "adv/explored_dropped": float(dropped),
    }
    if values is not None and returns is not None:
        from stages.rl.losses import explained_variance

        metrics |= {
            "critic/values_mean": float(values[m].mean()),
            "critic/returns_mean": float(returns[m].mean()),
            "critic/explained_var": explained_variance(values, returns, mask),
        }
    return out, metrics


def keep_better_explored(adv: Any, mask: Any, explored: list[list[int] | None]) -> tuple[Any, int]:
    """`adv` with the tokens of every explored turn (1-based turn numbers per row) whose mean
    advantage is negative set to 0, and how many turns that was."""
    from stages.rl.estimators import turn_spans

    adv, dropped = adv.clone(), 0
    for b, turns in enumerate(explored):
        spans = turn_spans(mask[b]) if turns else []
        for k in turns or []:
            s, e = spans[k - 1]
            if float(adv[b, s : e + 1].mean()) < 0:
                adv[b, s : e + 1] = 0.0
                dropped += 1
    return adv, dropped


def _values(table: pa.Table, critic: ArtifactRef | None, micro: int) -> Any:
    """The critic's values [B, T] over each trajectory's tokens, one forward pass per
    sample (a history window's samples each see only their own prompt)."""
    import numpy as np
    import torch

    from stages.models.batching import lengths, padded, per_sample
    from stages.models.critic import critic_base, load_critic
    from stages.models.forward import values

    if critic is None:
        raise ConfigProblem("estimator", "this estimator needs a critic, and none is wired")
    base = critic_base(critic)
    from stages.models.policy import training_device

    dev = training_device()  # a GPU where there is one: the critic's forward passes are a policy's size
    model = load_critic(critic.local_path(), device=dev, base=base.local_path() if base is not None else None).eval()
    samples = per_sample(table.select(["token_ids", "segments"]))
    sizes = lengths(samples)
    flat: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, samples.num_rows, micro):
            rows = np.arange(start, min(start + micro, samples.num_rows))
            b = padded(samples, rows, {"token_ids": torch.long})
            v = values(model, b["token_ids"].to(dev), b["attention"].to(dev)).cpu()
            flat += [v[i, : sizes[r]] for i, r in enumerate(rows)]
    per_token = torch.cat(flat) if flat else torch.zeros(0)
    traj = lengths(table)
    out = torch.zeros((table.num_rows, int(traj.max()) if len(traj) else 0))
    for i, (a, n) in enumerate(zip(np.concatenate([[0], np.cumsum(traj)[:-1]]), traj)):
        out[i, :n] = per_token[a : a + n]
    return out


@stage(
    "advantage",
    config=AdvantageConfig,
    outputs={
        "batch": Table(
            doc="trajectories with token advantages (stored as the advantage columns and row numbers into the kept trajectories)"
        )
    },
    wiring={"trajectories": "kept", "critic": "critic@prev"},
    check=_check,
    version=2,
    metrics={
        "adv/mean": "mean advantage over sampled tokens",
        "adv/std": "std of advantages",
        "adv/abs_max": "largest |advantage|",
        "adv/norm_score_mean": "mean normalised score",
        "adv/norm_score_std": "std of normalised scores",
        "adv/explored_dropped": "explored turns left untrained: their advantage was negative (explored: better)",
        "critic/values_mean": "mean critic value on sampled tokens (before the update)",
        "critic/returns_mean": "mean return target of the critic",
        "critic/explained_var": "1 - Var(returns - values) / Var(returns): how well the critic predicted this batch",
    },
)
def advantage(
    ctx: StageContext, cfg: AdvantageConfig, trajectories: TableRef, critic: ArtifactRef | None = None
) -> StageResult:
    """Normalise the scores and estimate per-token advantages (and returns)."""
    columns = [*BATCH_COLUMNS, *(["turns"] if cfg.turn_rewards or ESTIMATORS.needs(cfg.estimator, "turns") else [])]
    table, metrics = compute(read_explored(trajectories, columns), cfg, critic)
    own = table.select([c for c in table.column_names if c not in columns])  # what this stage adds
    return StageResult(tables={"batch": Selection(trajectories, np.arange(table.num_rows), own)}, metrics=metrics)
