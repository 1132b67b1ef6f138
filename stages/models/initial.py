"""A real model saved as the `policy.init` stage saves it (version 0, a plain checkpoint
with its tokenizer's end-of-turn fixed), for scripts that drive an engine on it without a
pipeline (`experiments/zeroshot.py`, `bench/real_engines.py`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stages.models.policy import ModelConfig, load_policy, save_policy
from stages.models.turns import fix_tokenizer


def save_initial(model: str, where: Path, log: Callable[[str], None] = print) -> Path:
    """`model` (a packaged model's name or a local folder) saved under `where` as
    policy version 0; each tokenizer fix is logged as a note."""
    cfg = ModelConfig(path=model)
    local = cfg.local_path(log=log)
    assert local is not None
    m, tok = load_policy(local)
    for note in fix_tokenizer(tok, m, cfg.template()):
        log(f"note: {note}")
    save_policy(m, tok, where, version=0, base=model)
    return where
