import json

import torch

from transformers import AutoModelForCausalLM

from catalog.views import query
from tests.conftest import run_spec
from tests.stages.conftest import TINY_MODEL_YAML

WARMSTART = """
run: {seed: 0}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
""" + TINY_MODEL_YAML + """
  envs: [sokoban, bandit]
  demonstrator: random_valid
  episodes: 6
  epochs: 3
  batch_size: 4
  check_episodes: 2
  agent: {max_turns: 2}
"""


def test_warm_start_trains_on_demonstrations_in_the_rollout_format(spec_file, catalog):
    run_spec(spec_file(WARMSTART.replace("demonstrator: none\n  episodes: 2\n  check_episodes: 0\n", "")), catalog)
    demos = query(catalog, "select * from demonstrations").to_pylist()
    assert len(demos) == 12 and {d["env"] for d in demos} == {"sokoban", "bandit"}
    assert all(d["format_valid_rate"] == 1.0 for d in demos)  # demonstrations always follow the format
    key = next(k for k in catalog.result_keys() if k.startswith("warmstart-"))
    m = catalog.manifest(key)["metrics"]
    assert m["actor/sft_loss"] < m["actor/sft_loss_first"]
    assert 0 <= m["eval/format_valid_rate"] <= 1 and "eval/success_rate" in m
    path = catalog.ref(key, "policy").local_path()
    assert json.loads((path / "policy.json").read_text())["version"] == 0
    model = AutoModelForCausalLM.from_pretrained(str(path))  # plain transformers, no project code
    assert model.config.model_type == "qwen2" and model.config.hidden_size == 64


def test_transcript_loss_covers_every_token_and_options_reach_the_demos(tokenizer):
    from stages.sft import sft_batch
    from stages.warmstart import WarmstartConfig, demonstrations

    cfg = WarmstartConfig(envs=("frozenlake",), env_options={"frozenlake": {"slippery": False}}, episodes=3)
    demos = demonstrations(cfg, tokenizer, seed=0)
    assert all(not d.env.opts.slippery for d in demos)
    ids, attn, responses = sft_batch(demos, tokenizer.pad_token_id)
    _, _, transcript = sft_batch(demos, tokenizer.pad_token_id, all_tokens=True)
    assert ((responses != -100).sum(1) == torch.tensor([sum(d.mask) for d in demos])).all()
    assert ((transcript != -100) == attn.bool()).all()
