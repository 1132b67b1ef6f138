"""The embedded model's construction: its initial weights follow `init_std`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from common.errors import SpecError
from pipelines.graph.load import load_spec
from stages.agent.corpus import embedded_model
from stages.models.policy import EmbeddedModel

SMALL = EmbeddedModel(hidden_size=64, heads=2, kv_heads=1, layers=1, intermediate_size=96)


def _matrix_std(model: torch.nn.Module) -> float:
    """Std over every 2-d weight (embeddings and projections) of the model."""
    return float(torch.cat([p.detach().flatten() for p in model.parameters() if p.dim() == 2]).std())


@pytest.mark.parametrize("std", [0.02, 0.05])
def test_initial_weights_follow_init_std(std: float) -> None:
    model, _ = embedded_model(replace(SMALL, init_std=std, tie_embeddings=False), seed=0)
    assert _matrix_std(model) == pytest.approx(std, rel=0.05)


def test_the_same_seed_builds_the_same_weights_and_another_std_other_ones() -> None:
    a, _ = embedded_model(replace(SMALL, init_std=0.05), seed=3)
    b, _ = embedded_model(replace(SMALL, init_std=0.05), seed=3)
    c, _ = embedded_model(SMALL, seed=3)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q), name
        if p.dim() == 2:
            assert not torch.equal(p, r), name


def test_a_spec_with_init_std_zero_fails_at_load_time() -> None:
    with pytest.raises(SpecError, match=r"model\.embedded\.init_std: expected a number > 0"):
        load_spec("starpo.yaml", ["model.embedded.init_std=0"])


def test_a_tokenizer_loaded_again_is_a_copy_of_the_first_until_its_files_change(tmp_path, monkeypatch) -> None:
    """Every version of a run carries the same tokenizer files: the second load (from any
    folder holding them) unpickles a copy of the first instead of parsing the files; a
    changed file is read again; closing the run's `Live` forgets them."""
    from common import live
    from stages.agent.corpus import embedded_tokenizer
    from stages.models import policy

    live.close_ambient()
    reads: list[str] = []
    read = policy._read_tokenizer
    monkeypatch.setattr(policy, "_read_tokenizer", lambda path: reads.append(str(path)) or read(path))
    tokenizer = embedded_tokenizer(300)
    for name in ("a", "b"):
        tokenizer.save_pretrained(tmp_path / name)
    a, b = policy.load_tokenizer(tmp_path / "a"), policy.load_tokenizer(tmp_path / "b")
    assert reads == [str(tmp_path / "a")] and a is not b
    assert b.name_or_path == str(tmp_path / "b") and b.padding_side == "left"
    assert b("<answer>Left</answer>").input_ids == a("<answer>Left</answer>").input_ids
    b.padding_side = "right"  # a caller's change stays its own
    assert policy.load_tokenizer(tmp_path / "a").padding_side == "left" and len(reads) == 1
    config = tmp_path / "b" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 77}))
    assert policy.load_tokenizer(tmp_path / "b").model_max_length == 77 and len(reads) == 2
    live.close_ambient()
    policy.load_tokenizer(tmp_path / "a")
    assert len(reads) == 3


def test_a_bfloat16_spec_trains_float32_master_weights_and_its_engines_run_bfloat16(tiny_policy, tmp_path):
    """model.dtype: bfloat16 (the paper's GPU setting). Trainers, the warm start and the
    critic load float32 (an update of 1e-6 relative survives, which bfloat16's 8 bits
    of mantissa would round away); each saved version declares bfloat16, so the engines
    run in it and the weights they get from memory are bfloat16 too (half the bytes)."""
    import json

    import torch
    from safetensors.torch import load_file

    from stages.engines.hf import HFEngine
    from stages.models.critic import make_critic
    from stages.models.policy import engine_state, load_policy, save_policy

    model, tokenizer = load_policy(tiny_policy)
    v0 = tmp_path / "v0"
    save_policy(model.to(torch.bfloat16), tokenizer, v0, version=0)
    trained, tokenizer = load_policy(v0, dtype="float32")
    assert trained.dtype == torch.float32 and trained.compute_dtype == "bfloat16"
    weight = next(p for p in trained.parameters() if p.dim() == 2)
    with torch.no_grad():
        weight.mul_(1 + 1e-6)  # a small update, as AdamW at lr 1e-6 makes
    kept = weight.detach().clone()
    v1 = tmp_path / "v1"
    save_policy(trained, tokenizer, v1, version=1)
    assert json.loads((v1 / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(str(v1 / "model.safetensors")).values()} == {torch.float32}
    again, _ = load_policy(v1, dtype="float32")
    assert any(torch.equal(p, kept) for p in again.parameters())  # the update survived storage
    assert not torch.equal(kept.to(torch.bfloat16).float(), kept)  # where bfloat16 would have lost it
    assert HFEngine(v1).model.dtype == torch.bfloat16
    assert {t.dtype for t in engine_state(trained).values() if t.is_floating_point()} == {torch.bfloat16}
    assert {p.dtype for p in make_critic(v0).parameters()} == {torch.float32}
