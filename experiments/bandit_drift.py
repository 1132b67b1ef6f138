"""Which way does one StarPO update push a bandit policy, before any model is involved?

The bi-arm bandit pays 0.1 for the low-risk arm and 1.0 with p = 0.25 for the high-risk
one (expected 0.25 > 0.1). A policy is reduced to two numbers: a preference for the
high arm by name (theta_name) and one for the arm named first in the prompt (theta_pos):
    logit P(high) = theta_name + theta_pos * (+1 if the high arm is named first else -1).
All trajectories of a group share their initial state, so they see the same order; the
order is drawn per group. For each estimator and filter this draws many rollout batches,
keeps the groups the project's own filter keeps (`stages.filter.keep_groups`), computes
the project's own advantages (`stages.rl.estimators`) and averages the policy gradient
(the mean over kept trajectories of advantage x d log pi / d theta, as a token-mean loss
over one-token answers does). A positive `name` drift moves the policy towards the
high arm; a positive `pos` drift towards whichever arm is named first (the shortcut).

    python experiments/bandit_drift.py                  # about 1 minute here
    python experiments/bandit_drift.py --groups 4 --group-size 8 --batches 4000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import torch

from stages.filter import FilterConfig, keep_groups
from stages.rl.estimators import grpo, normalize_scores, rloo

LOW, HIGH, HIGH_P = 0.1, 1.0, 0.25

ESTIMATORS = {
    "grpo (mean_std)": lambda s, g: grpo(s, g, torch.ones(len(s), 1))[:, 0],
    "rloo": lambda s, g: rloo(s, g, torch.ones(len(s), 1))[:, 0],
    "batch mean (advantage.grouping: batch, method: mean)": lambda s, g: normalize_scores(s, g, "batch", "mean"),
}
FILTERS = {
    "none (vanilla)": FilterConfig(strategy="none", ratio=1.0),
    "top_k 0.5, drop zero std": FilterConfig(strategy="top_k", ratio=0.5, drop_zero_std=True),
    "top_k 0.25 (StarPO-S)": FilterConfig(strategy="top_k", ratio=0.25),
}
#: (label, theta_name, theta_pos): a policy leaning to the low arm, an undecided one, one
#: leaning to the high arm, and the first-named template, loose and nearly sure.
POLICIES = [
    ("P(high) 0.25", float(np.log(1 / 3)), 0.0),
    ("P(high) 0.50", 0.0, 0.0),
    ("P(high) 0.75", float(np.log(3)), 0.0),
    ("first-named 0.80", 0.0, float(np.log(4))),
    ("first-named 0.97", 0.0, float(np.log(32))),
]


def drift(
    theta_name: float,
    theta_pos: float,
    estimator: str,
    filt: FilterConfig,
    groups: int,
    size: int,
    batches: int,
    seed: int,
) -> tuple[float, float, float]:
    """Mean (name, pos) gradient per update and the mean share of trajectories kept."""
    rng = np.random.default_rng(seed)
    fn = ESTIMATORS[estimator]
    g_name = g_pos = kept_share = 0.0
    group_ids = np.repeat(np.arange(groups), size)
    for _ in range(batches):
        high_first = np.repeat(np.where(rng.random(groups) < 0.5, 1.0, -1.0), size)
        p_high = 1.0 / (1.0 + np.exp(-(theta_name + theta_pos * high_first)))
        high = rng.random(groups * size) < p_high
        scores = np.where(high, np.where(rng.random(groups * size) < HIGH_P, HIGH, 0.0), LOW)
        table = pa.table({"score": scores, "group": group_ids})
        rows, _ = keep_groups(table, filt)
        kept_share += len(rows) / len(scores)
        if len(rows) == 0:
            continue
        adv = fn(torch.tensor(scores[rows]), torch.tensor(group_ids[rows])).numpy()
        dlogp = high[rows] - p_high[rows]  # d log pi(a) / d logit P(high)
        g_name += float(np.mean(adv * dlogp))
        g_pos += float(np.mean(adv * dlogp * high_first[rows]))
    return g_name / batches, g_pos / batches, kept_share / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2000, help="rollout batches drawn per cell")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"groups {args.groups} x {args.group_size}, {args.batches} batches a cell; drift as name / pos (x1000)")
    print("| estimator | filter | " + " | ".join(label for label, _, _ in POLICIES) + " |")
    print("|---|---|" + "---|" * len(POLICIES))
    for est in ESTIMATORS:
        for fname, filt in FILTERS.items():
            cells = []
            for _, tn, tp in POLICIES:
                n, p, _ = drift(tn, tp, est, filt, args.groups, args.group_size, args.batches, args.seed)
                cells.append(f"{1000 * n:+.0f} / {1000 * p:+.0f}")
            print(f"| {est} | {fname} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
