"""The `policy.init` stage: the first policy (version 0).

It builds the embedded model (`stages.agent.corpus.embedded_model`) or loads
``model.path`` (a local Hugging Face checkpoint) and saves it as policy version 0.
"""

from __future__ import annotations

from catalog.datasets import Artifact
from stages.agent.corpus import embedded_model
from stages.models.lora import recorded
from stages.models.policy import ModelConfig, load_policy, save_policy
from stages.registry import StageContext, StageResult, stage


@stage("policy.init", config=ModelConfig, outputs={"base": Artifact("the initial policy (version 0)")})
def init_policy(ctx: StageContext, cfg: ModelConfig) -> StageResult:
    """Build the embedded model, or load `path`, and save it as policy version 0."""
    import torch

    if cfg.path:
        model, tokenizer = load_policy(cfg.path, dtype=cfg.dtype)
    else:
        model, tokenizer = embedded_model(cfg.embedded, ctx.seed)
        model = model.to(getattr(torch, cfg.dtype))
    save_policy(model, tokenizer, ctx.output_dir("base"), version=0, base=cfg.path or "embedded", **recorded(cfg.lora))
    return StageResult()
