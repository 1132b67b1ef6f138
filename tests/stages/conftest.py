"""A tiny embedded policy shared by the stage tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.policy import EmbeddedModel, build_embedded, save_policy

TINY = EmbeddedModel(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128, vocab_size=600)

#: spec lines that make the tiny policy the pipeline's first policy (no training)
TINY_MODEL_YAML = """
model:
  embedded: {hidden_size: 64, layers: 2, heads: 2, kv_heads: 1, intermediate_size: 128, vocab_size: 600}
warmstart:
  demonstrator: none
  episodes: 2
  check_episodes: 0
"""


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = build_embedded(TINY, seed=0)
    path = tmp_path_factory.mktemp("tiny") / "policy"
    save_policy(model, tokenizer, path, version=0)
    return path


@pytest.fixture(scope="session")
def tokenizer(tiny_policy: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_policy))
