"""The RL variants a spec chooses by name: advantage estimators, score
normalisations and filter strategies, one entry each with its doc and its needs
(`common.choices`). Importing this module imports no torch: the spec checks read it.

Needs: "critic" (the critic's values), "groups" (several trajectories per initial
state), "turns" (each turn's state and reward).
"""

from __future__ import annotations

from typing import Literal

from common.choices import Choice, Choices

Estimator = Literal["gae", "bi_level_gae", "grpo", "rloo", "reinforce_pp", "gigpo"]
#: advantage estimators: f(AdvantageBatch, Discount) -> (advantages, returns or None)
ESTIMATORS = Choices(
    "estimator",
    Estimator,
    [
        Choice(
            "gae",
            "token-level GAE on the critic's values (PPO)",
            "stages.rl.estimators:estimate_gae",
            frozenset({"critic"}),
        ),
        Choice(
            "bi_level_gae",
            "GAE over turns, then over the tokens of each turn",
            "stages.rl.estimators:estimate_bi_level_gae",
            frozenset({"critic"}),
        ),
        Choice(
            "grpo",
            "the trajectory's normalised score on every sampled token (no critic)",
            "stages.rl.estimators:estimate_grpo",
            frozenset({"groups"}),
        ),
        Choice(
            "rloo",
            "score minus the mean of the group's other scores",
            "stages.rl.estimators:estimate_rloo",
            frozenset({"groups"}),
        ),
        Choice(
            "reinforce_pp",
            "discounted token returns, whitened over the batch (REINFORCE++)",
            "stages.rl.estimators:estimate_reinforce_pp",
        ),
        Choice(
            "gigpo",
            "grpo plus step-level advantages over identical states (GiGPO)",
            "stages.rl.estimators:estimate_gigpo",
            frozenset({"groups", "turns"}),
        ),
    ],
)

Normalization = Literal["identity", "mean", "mean_std", "asym_clip"]
#: score normalisations, applied per group, over the batch or not at all (`grouping`)
METHODS = Choices(
    "method",
    Normalization,
    [
        Choice("identity", "scores as they are", "stages.rl.estimators:identity"),
        Choice("mean", "minus the mean", "stages.rl.estimators:mean_centred"),
        Choice("mean_std", "minus the mean, over the std (0 when the std is ~0)", "stages.rl.estimators:mean_std"),
        Choice("asym_clip", "mean_std clipped to [-1, 3]", "stages.rl.estimators:asym_clip"),
    ],
)

FilterStrategy = Literal["top_k", "top_p", "adaptive", "min_p", "std_rev", "none"]
#: uncertainty filters: f(group stds, ratio) -> indices of the kept groups
STRATEGIES = Choices(
    "strategy",
    FilterStrategy,
    [
        Choice(
            "top_k", "the ratio x groups with the highest std", "stages.rl.uncertainty:top_k", frozenset({"groups"})
        ),
        Choice(
            "top_p",
            "the highest-std groups holding ratio of the total std",
            "stages.rl.uncertainty:top_p",
            frozenset({"groups"}),
        ),
        Choice(
            "adaptive",
            "the highest-variance groups holding ratio of the in-group variance, none with zero variance: the "
            "share kept follows each batch (RAGEN-2's SNR filter; ratio 0.9)",
            "stages.rl.uncertainty:adaptive",
            frozenset({"groups"}),
        ),
        Choice(
            "min_p",
            "every group whose std is at least ratio x the largest",
            "stages.rl.uncertainty:min_p",
            frozenset({"groups"}),
        ),
        Choice(
            "std_rev",
            "the ratio x groups with the lowest std (an ablation)",
            "stages.rl.uncertainty:std_rev",
            frozenset({"groups"}),
        ),
        Choice("none", "keep every group (vanilla StarPO)", "stages.rl.uncertainty:keep_all"),
    ],
)
