"""The pretrain once-stage: probe answers before the warm start, cached like every stage."""

from __future__ import annotations

import json

from tests.conftest import run_spec
from tests.stages.conftest import TINY_MODEL_YAML

PRETRAIN = (
    """
run: {seed: 0}
pipeline:
  model: {stage: policy.init, once: true}
  pretrain: {stage: pretrain, once: true}
  warmstart: {stage: warmstart, once: true, inputs: {base: pretrained}}
pretrain:
  envs: [frozenlake, sokoban]
  env_options: {frozenlake: {slippery: false, render: grid}}
  states: 12
  held_out: 6
  steps: 30
  batch_size: 4
  lr: 3.0e-3
"""
    + TINY_MODEL_YAML
)


def test_pretrain_reports_held_out_accuracy_and_feeds_the_warm_start(spec_file, catalog):
    path = spec_file(PRETRAIN)
    summary, _ = run_spec(path, catalog)
    assert summary.ran == 3
    key = next(k for k in catalog.result_keys() if k.startswith("pretrain-"))
    m = catalog.manifest(key)["metrics"]
    for env, tasks in {"frozenlake": ("neighbour", "position", "goal_offset"), "sokoban": ("box_offset",)}.items():
        for task in tasks:
            assert 0.0 <= m[f"pretrain/{env}/{task}"] <= 1.0 and f"pretrain/{env}/{task}_before" in m
    assert m["pretrain/loss"] > 0
    out = catalog.ref(key, "pretrained").local_path()
    assert json.loads((out / "policy.json").read_text())["pretrained"] is True
    warm = next(k for k in catalog.result_keys() if k.startswith("warmstart-"))
    assert catalog.manifest(warm)["inputs"]["base"] == f"{key}/pretrained"
    again, _ = run_spec(path, catalog)
    assert again.ran == 0  # cached: only the first run pays for it


def test_the_linear_schedule_warms_up_then_decays_to_a_tenth():
    import torch

    from stages.training.sft import linear_decay

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = linear_decay(opt, 100)
    seen = []
    for _ in range(100):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[0] == 0.2 and seen[4] == 1.0  # 5 warm-up steps
    assert seen == sorted(seen[:5]) + sorted(seen[5:], reverse=True)
    assert abs(seen[-1] - (1.0 - 0.9 * 94 / 95)) < 1e-9 and seen[-1] > 0.1
