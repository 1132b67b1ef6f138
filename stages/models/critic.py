"""The critic: a value head on the policy, a Hugging Face token-classification model
with one label (``AutoModelForTokenClassification``). Its values:
`stages.models.forward.values`.

Without LoRA the critic is a copy of the policy, saved and loaded as a plain
checkpoint. With LoRA (`stages.models.lora`) it shares the policy's frozen base: the
checkpoint holds only a critic adapter and the value head (peft, the head as a
module saved whole), and ``critic.json`` names the base's catalog address, which the
stages resolve and hand to `load_critic`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from catalog.datasets import ArtifactRef

CRITIC_FILE = "critic.json"


def _head(policy_dir: Path) -> Any:
    """A value head (random, small) on the weights of `policy_dir`."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    from stages.models.policy import _quiet

    _quiet()
    config = AutoConfig.from_pretrained(str(policy_dir), num_labels=1)
    config.classifier_dropout = 0.0  # a value target, not a classifier: no dropout on it
    # float32 whatever the policy's dtype: a bfloat16 AdamW loses most updates at a small learning rate
    return AutoModelForTokenClassification.from_pretrained(str(policy_dir), config=config, dtype=torch.float32)


def make_critic(policy_dir: Path, lora: dict[str, Any] | None = None) -> Any:
    """A value head on the policy: on a copy of its weights, or (with `lora`
    settings) a trainable critic adapter and head on its frozen weights."""
    model = _head(policy_dir)
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["target_modules"]),
        modules_to_save=["score"],
        task_type="TOKEN_CLS",
    )
    return get_peft_model(model, config)


def critic_info(path: Path) -> dict[str, Any]:
    """The critic's ``critic.json``: its version, and with LoRA its settings and base."""
    return dict(json.loads((Path(path) / CRITIC_FILE).read_text()))


def load_critic(path: Path, device: Any = "cpu", base: Path | None = None, trainable: bool = False) -> Any:
    """A critic saved by `critic.init` or `critic.update`; a LoRA critic needs its
    `base` (the policy checkpoint named in its ``critic.json``)."""
    import torch
    from transformers import AutoModelForTokenClassification

    from stages.models.policy import _quiet

    _quiet()
    if "lora" not in critic_info(path):
        return AutoModelForTokenClassification.from_pretrained(str(path), dtype=torch.float32).to(device)
    if base is None:
        raise ValueError(f"critic {path} is a LoRA adapter: its base policy is needed to load it")
    from peft import PeftModel

    return PeftModel.from_pretrained(_head(base), str(path), is_trainable=trainable).to(device)


def critic_base(critic: ArtifactRef) -> ArtifactRef | None:
    """The policy a LoRA critic sits on (None for a critic that is a whole model)."""
    address = critic_info(critic.local_path()).get("base")
    if address is None:
        return None
    key, output = address.split("/", 1)
    return ArtifactRef(critic.root, key, output)
