"""A tiny embedded policy shared by the stage tests (built once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stages.agent.corpus import embedded_model
from stages.models.policy import EmbeddedModel, save_policy

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


def artifact(catalog: Any, prefix: str, iteration: int | None, output: str) -> Path:
    """The local folder of `output` of the result whose key starts with `prefix`, at `iteration`."""
    for key in catalog.result_keys():
        m = catalog.manifest(key)
        if key.startswith(prefix) and m["iteration"] == iteration:
            return catalog.ref(key, output).local_path()
    raise AssertionError(f"no {prefix} result at iteration {iteration}")


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = embedded_model(TINY, seed=0)
    path = tmp_path_factory.mktemp("tiny") / "policy"
    save_policy(model, tokenizer, path, version=0)
    return path


@pytest.fixture(scope="session")
def tokenizer(tiny_policy: Path):
    from stages.models.policy import load_tokenizer

    return load_tokenizer(tiny_policy)


#: a whole StarPO pipeline on the tiny policy: seconds per iteration
TINY_STARPO = """
run: {iterations: 2, seed: 5}
pipeline:
  model:       {stage: policy.init, once: true}
  warmstart:   {stage: warmstart, once: true}
  critic_init: {stage: critic.init, once: true}
  eval_start:  {stage: eval, once: true, config: eval}
  rollout:     {stage: rollout}
  filter:      {stage: filter}
  advantage:   {stage: advantage}
  update:      {stage: update}
  critic:      {stage: critic.update}
  eval:        {stage: eval, every: 2}
rollout: {env: sokoban, n_groups: 3, group_size: 2, actors: 0, agent: &agent {max_turns: 2, max_new_tokens: 8}}
filter: {strategy: top_k, ratio: 0.67}
advantage: {estimator: gae}
update: {optim: {lr: 1.0e-3, mini_batch_size: 2, micro_batch_size: 1}, kl_coef: 0.01}
critic: {optim: {lr: 1.0e-3, mini_batch_size: 2, micro_batch_size: 1}}
eval: {envs: [sokoban, sokoban_new_vocab], episodes: 2, samples: 2, greedy: true, agent: *agent}
""" + TINY_MODEL_YAML.replace("warmstart:\n", "warmstart:\n  agent: {max_turns: 2, max_new_tokens: 8}\n")

#: the smallest learning pipeline: bandit rollouts, GRPO, update (no critic, no eval)
TINY_GRPO = (
    """
run: {iterations: 2, seed: 3}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  rollout: {stage: rollout}
  advantage: {stage: advantage, inputs: {trajectories: trajectories}}
  update: {stage: update}
rollout: {env: bandit, n_groups: 2, group_size: 2, actors: 0, agent: {max_new_tokens: 8}}
advantage: {estimator: grpo}
update: {optim: {lr: 1.0e-3, mini_batch_size: 4, micro_batch_size: 4}}
"""
    + TINY_MODEL_YAML
)


def tiny_qwen2(tie: bool = False) -> Any:
    """A tiny random Qwen2 (the architecture of the Qwen2.5 checkpoints; `tie`: input and
    output embeddings shared, as in Qwen2.5-0.5B and SmolLM2), the same weights each call."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    return Qwen2ForCausalLM(cfg)
