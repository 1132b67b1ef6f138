"""The critic: a value head on a copy of the policy, a Hugging Face
token-classification model with one label, saved and loaded as a plain checkpoint
(``AutoModelForTokenClassification``). Its values: `stages.models.forward.values`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_critic(policy_dir: Path) -> Any:
    """A value head (random, small) on a copy of the policy's weights."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    from stages.models.policy import _quiet

    _quiet()
    config = AutoConfig.from_pretrained(str(policy_dir), num_labels=1)
    config.classifier_dropout = 0.0  # a value target, not a classifier: no dropout on it
    return AutoModelForTokenClassification.from_pretrained(str(policy_dir), config=config)


def load_critic(path: Path, device: Any = "cpu") -> Any:
    """A critic saved by the update (or by `critic.init`)."""
    from transformers import AutoModelForTokenClassification

    from stages.models.policy import _quiet

    _quiet()
    return AutoModelForTokenClassification.from_pretrained(str(path)).to(device)
