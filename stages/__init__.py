"""Stages of the pipeline, registered by name (see `stages.registry`).

Importing this package registers every stage: one module per stage, named after it
(`rollout`, `filter`, `advantage`, `update`, `critic`, `eval`, `policy`, `pretrain`,
`warmstart`, `replay`, `mutual_info`, `score`), holding its config, its wiring and its I/O. What they call
lives in sub-packages by role: `agent` (the agent loop, prompts, history, playing
episodes on engines), `rl` (advantage estimators, losses, filters, collapse
indicators: pure functions), `models` (checkpoints, forward passes, tokenizer,
supervised fine-tuning), `training` (Ray Train), `engines` (generation). Stage
modules import torch and ray inside their functions, so loading a spec stays fast.
"""

from stages import (  # noqa: F401
    advantage,
    critic,
    eval,
    filter,
    mutual_info,
    policy,
    pretrain,
    replay,
    rollout,
    score,
    update,
    warmstart,
)
from stages.registry import STAGES, StageContext, StageResult, stage

__all__ = ["STAGES", "StageContext", "StageResult", "stage"]
