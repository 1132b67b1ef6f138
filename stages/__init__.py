"""Stages of the pipeline, registered by name (see `stages.registry`).

Importing this package registers every stage. Stage modules import heavy
libraries (torch, ray) inside their functions, so loading a spec stays fast.
"""

from stages import advantage, demo, evaluate, filter, replay, rollout, update, warmstart  # noqa: F401
from stages.registry import STAGES, StageContext, StageResult, stage

__all__ = ["STAGES", "StageContext", "StageResult", "stage"]
