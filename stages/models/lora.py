"""LoRA adapters (peft): the update trains a low-rank adapter, the base stays frozen.

``model.lora: {r: 8}`` in a spec turns it on. `policy.init` records the settings in
the policy's ``policy.json``; the warm start (a full fine-tune, or a copy without
demonstrations) keeps them. From then on every policy checkpoint holds:

- ``adapter/``: the adapter alone (peft's ``save_pretrained``), what the next update
  trains further, and ``policy.json``'s ``lora.base``: the catalog key of the base
  it sits on, which is the update's `reference` (the warm-started policy,
  ``policy@once``);
- the merged weights (base + adapter) as a plain checkpoint at the top: what every
  engine loads, unchanged. For vLLM this is the merged weights as well, not a LoRA
  request: the engine then reloads each version in place like a full fine-tune
  (`stages.engines.hosts`), with no ``enable_lora`` / rank limits to configure and
  the same code on CPU and GPU; a LoRA request would save the reload but needs the
  base kept in the engine and the adapter shipped per request.

The KL reference is the base itself: the adapter switched off (`disabled`), not a
second copy of the model. Needs the ``peft`` package (``pip install -e '.[lora]'``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.config import ConfigProblem, param

ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class LoraSettings:
    """`model.lora:` — a LoRA adapter instead of full fine-tuning."""

    r: int = param(8, "rank of the adapter's matrices", ge=1)
    alpha: float = param(16.0, "scale: the update is alpha / r x B A", gt=0)
    dropout: float = param(0.0, "dropout on the adapter's input", ge=0, lt=1)
    target_modules: tuple[str, ...] = param(
        ("q_proj", "k_proj", "v_proj", "o_proj"), "the linear layers that get an adapter (by name)"
    )

    def __post_init__(self) -> None:
        if not self.target_modules:
            raise ConfigProblem("target_modules", "expected at least one module name")


def settings_of(policy_dir: Path) -> dict[str, Any] | None:
    """The LoRA settings recorded in a policy checkpoint (None: full fine-tuning)."""
    info = json.loads((Path(policy_dir) / "policy.json").read_text())
    lora = info.get("lora")
    return dict(lora) if lora else None


def recorded(settings: LoraSettings | None) -> dict[str, Any]:
    """``policy.json`` entries for `settings` (nothing without LoRA)."""
    return {} if settings is None else {"lora": {**asdict(settings), "target_modules": list(settings.target_modules)}}


def attach(base: Any, policy_dir: Path, lora: dict[str, Any]) -> Any:
    """`base` with the adapter of `policy_dir` (a new one, initialised to zero
    change, when the checkpoint has none yet), trainable."""
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError:
        raise RuntimeError("model.lora needs peft: pip install -e '.[lora]'") from None
    adapter = Path(policy_dir) / ADAPTER_DIR
    if adapter.is_dir():
        return PeftModel.from_pretrained(base, str(adapter), is_trainable=True)
    config = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["target_modules"]),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, config)


@contextmanager
def disabled(model: Any) -> Iterator[None]:
    """The base model's forward passes: the adapter switched off."""
    with model.disable_adapter():
        yield


def trainable(model: Any) -> tuple[int, int]:
    """(trainable parameters, all parameters)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def save_adapter(model: Any, out: Path) -> Any:
    """Write the adapter into `out` and return the merged model, which the caller
    saves as the plain policy checkpoint (module docstring). Merging changes `model`:
    call it last."""
    model.save_pretrained(str(out / ADAPTER_DIR))
    return model.merge_and_unload()
