"""Imported by the resume tests' fork server (`test_resume.PRELOAD`): what every process
forked from it would otherwise do first, done once. The modules a small run imports
lazily (the model's classes, generation, the tokenizer, the trainers) and the stages'
code fingerprints (`common.code`, about 0.4 s a process) are then inherited by each."""

from __future__ import annotations

import importlib

from stages.registry import STAGES

LAZY = (
    "transformers.modeling_utils",
    "transformers.generation.utils",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "tokenizers",
    "pyarrow.dataset",
    "stages.engines.hf",
    "stages.models.tokenizer",
    "stages.models.forward",
    "stages.training.sft",
    "stages.training.pretrain",
    "stages.rl.losses",
    "stages.rl.estimators",
)

for _name in LAZY:
    importlib.import_module(_name)
for _stage in STAGES.values():
    _stage.code  # noqa: B018  (computed and cached)
