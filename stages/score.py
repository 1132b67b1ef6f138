"""The `score` stage: a policy's success estimated off-policy on stored trajectories
(`stages.rl.offpolicy`), without a rollout; `pipeline score` is the same from the
command line.

Wire the trajectories to score on (e.g. the warm start's eval: ``inputs:
{trajectories: evals@once}``) and the policy (the iteration's new one by default).
Only turns sampled at a temperature above 0 can be reweighted; greedy rows are left
out. The estimate is for the target policy sampled at the rows' temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.datasets import ArtifactRef, TableRef
from common.config import param
from stages.registry import StageContext, StageResult, stage
from stages.rl.offpolicy import MIN_ESS, Estimate, estimate, turn_sums

COLUMNS = ["token_ids", "loss_mask", "logprobs", "temperature", "segments", "turns", "success"]


def sampled_rows(table: pa.Table) -> pa.Table:
    """The rows sampled at a temperature above 0 (greedy rows cannot be reweighted)."""
    return table.filter(pc.greater(table.column("temperature"), 0.0))


def turn_log_ratios(model: Any, table: pa.Table, micro: int) -> list[list[float]]:
    """Per trajectory, per turn: log pi_model - log pi_behaviour summed over the turn's
    sampled tokens (the behaviour's log-probs are the stored ones)."""
    import torch

    from stages.models.batching import lengths, padded, per_sample
    from stages.models.forward import sampled_logprobs

    samples = per_sample(table.append_column("row", pa.array(np.arange(table.num_rows))))
    sizes = lengths(samples)
    diffs: list[list[float]] = [[] for _ in range(table.num_rows)]
    masks: list[list[int]] = [[] for _ in range(table.num_rows)]
    stored = samples.column("logprobs").to_pylist()
    rows = samples.column("row").to_pylist()
    with torch.no_grad():
        for start in range(0, samples.num_rows, micro):
            part = np.arange(start, min(start + micro, samples.num_rows))
            b = padded(samples, part, {"token_ids": torch.long, "loss_mask": torch.long})
            temps = torch.tensor([samples.column("temperature")[int(r)].as_py() for r in part], dtype=torch.float32)
            logp, _ = sampled_logprobs(model, b["token_ids"], b["attention"], b["loss_mask"], temps)
            for i, r in enumerate(part):
                n = int(sizes[r])
                mask = b["loss_mask"][i, :n].tolist()
                new = logp[i, :n].tolist()
                diffs[rows[r]] += [(x - y) if m else 0.0 for x, y, m in zip(new, stored[r], mask)]
                masks[rows[r]] += mask
    return [turn_sums(d, m) for d, m in zip(diffs, masks)]


def _fit(rewards: list[float], turns: int) -> list[float]:
    """Per-turn rewards for `turns` sampled responses (a turn without sampled tokens has
    no ratio: the rewards past the last response are added to it)."""
    if len(rewards) <= turns:
        return rewards + [0.0] * (turns - len(rewards))
    return [*rewards[: turns - 1], sum(rewards[turns - 1 :])] if turns else []


def score_policy(model: Any, table: pa.Table, micro: int = 32, seed: int = 0, boot: int = 1000) -> Estimate:
    """The off-policy estimate of `model` on the sampled rows of a trajectory table."""
    table = sampled_rows(table)
    if table.num_rows == 0:
        raise ValueError("no trajectory sampled at a temperature above 0 to score on")
    ratios = turn_log_ratios(model, table, micro)
    rewards = [
        _fit([t["reward"] for t in turns], len(r)) for turns, r in zip(table.column("turns").to_pylist(), ratios)
    ]
    return estimate(ratios, rewards, table.column("success").to_pylist(), boot=boot, seed=seed)


@dataclass(frozen=True)
class ScoreConfig:
    """`score:` — off-policy scoring of a policy on stored trajectories."""

    micro_batch_size: int = param(32, "sequences per forward pass", ge=1)
    bootstrap: int = param(1000, "bootstrap resamples for the 95% interval", ge=100)


@stage(
    "score",
    config=ScoreConfig,
    outputs={},
    wiring={"policy": "policy"},
    metrics={
        "offpolicy/success": "estimated success of the policy on the wired trajectories' initial states (PDWIS)",
        "offpolicy/success_low": "2.5% bootstrap quantile of the success estimate",
        "offpolicy/success_high": "97.5% bootstrap quantile of the success estimate",
        "offpolicy/score": "estimated mean trajectory score (PDWIS)",
        "offpolicy/ess": "effective sample size of the trajectory weights (< 30: do not trust the estimate)",
        "offpolicy/episodes": "stored trajectories scored on (those sampled at T > 0)",
    },
)
def score(ctx: StageContext, cfg: ScoreConfig, trajectories: TableRef, policy: ArtifactRef) -> StageResult:
    """Estimate the policy's success on stored trajectories, without playing."""
    from stages.models.policy import load_model

    model = load_model(policy.local_path(), dtype="float32").eval()
    est = score_policy(model, trajectories.read(COLUMNS), cfg.micro_batch_size, ctx.step_seed, cfg.bootstrap)
    ctx.log(
        f"score: success {est.success:.1%} [{est.success_ci[0]:.1%}, {est.success_ci[1]:.1%}], "
        f"ESS {est.ess:.0f} of {est.episodes}" + ("" if est.trusted else f" (below {MIN_ESS:.0f}: not to be trusted)")
    )
    return StageResult(
        metrics={
            "offpolicy/success": est.success,
            "offpolicy/success_low": est.success_ci[0],
            "offpolicy/success_high": est.success_ci[1],
            "offpolicy/score": est.score,
            "offpolicy/ess": est.ess,
            "offpolicy/episodes": float(est.episodes),
        }
    )
