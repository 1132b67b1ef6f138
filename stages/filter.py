"""The filter stage (StarPO-S, docs/method.md#starpo-s-uncertainty-filtering): keep the rollout's most uncertain groups.

The strategies and the std they rank by are in `stages.rl.uncertainty`; this stage
applies one to a rollout table and passes the kept trajectories on unchanged: as a
selection of the rollout's rows (`catalog.datasets.Selection`), not a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from catalog.datasets import Selection, Table, TableRef
from common.config import ConfigProblem, param
from stages.registry import Neighbours, StageContext, StageResult, stage
from stages.rl.registry import STRATEGIES, FilterStrategy
from stages.rl.uncertainty import group_stds


@dataclass(frozen=True)
class FilterConfig:
    """`filter:` — which groups of the rollout are trained on."""

    strategy: FilterStrategy = param("top_k", "which groups are kept (vanilla StarPO: none)", choices=STRATEGIES)
    ratio: float = param(
        0.25,
        "top_k / std_rev: fraction of groups kept (StarPO-S: 0.25); top_p: share of "
        "the std mass; adaptive: share of the in-group variance (RAGEN-2: 0.9); min_p: fraction of the largest std",
        gt=0,
        le=1,
    )
    drop_zero_std: bool = param(
        False,
        "also drop the kept groups whose trajectories all scored the same (they "
        "carry no group-relative signal); an iteration where none is left trains "
        "on nothing and keeps the policy",
    )


def _check(cfg: FilterConfig, pipeline: Neighbours) -> None:
    rollout = pipeline.upstream("rollout")
    if STRATEGIES.needs(cfg.strategy, "groups") and rollout is not None and rollout.group_size < 2:
        raise ConfigProblem(
            "strategy",
            f"'{cfg.strategy}' ranks groups by the std of their scores, but "
            "rollout.group_size is 1: use strategy: none or group_size >= 2",
        )


def keep_groups(table: pa.Table, cfg: FilterConfig) -> tuple[np.ndarray, dict[str, float]]:
    """The numbers of the kept rows and the filter's metrics."""
    scores, groups = table["score"].to_numpy(), table["group"].to_numpy()
    ids, stds = group_stds(scores, groups)
    kept = STRATEGIES[cfg.strategy](stds, cfg.ratio)
    if cfg.drop_zero_std:
        kept = kept[stds[kept] > 0]
    rows = np.flatnonzero(np.isin(groups, ids[kept]))
    return rows, {
        "filter/kept_groups": float(len(kept)),
        "filter/groups": float(len(ids)),
        "filter/kept_trajectories": float(len(rows)),
        "filter/in_group_std_kept": float(stds[kept].mean()) if len(kept) else 0.0,
        "filter/in_group_std_all": float(stds.mean()) if len(stds) else 0.0,
        "filter/zero_std_groups": float((stds == 0).sum()),
        "filter/kept_share": float(len(kept) / len(ids)) if len(ids) else 0.0,
    }


@stage(
    "filter",
    config=FilterConfig,
    outputs={"kept": Table(doc="the kept trajectories (stored as their row numbers in the rollout's table)")},
    check=_check,
    version=2,
    metrics={
        "filter/kept_groups": "groups kept",
        "filter/groups": "groups in the rollout",
        "filter/kept_trajectories": "trajectories kept",
        "filter/in_group_std_kept": "mean in-group score std of the kept groups",
        "filter/in_group_std_all": "mean in-group score std of all groups",
        "filter/zero_std_groups": "groups whose trajectories all scored the same",
        "filter/kept_share": "share of the rollout's groups kept (strategy adaptive sets it from each batch)",
    },
)
def filter_groups(ctx: StageContext, cfg: FilterConfig, trajectories: TableRef) -> StageResult:
    """Keep the groups with the most uncertain outcomes (std of raw scores)."""
    rows, metrics = keep_groups(trajectories.read(["score", "group"]), cfg)
    return StageResult(tables={"kept": Selection(trajectories, rows)}, metrics=metrics)
