"""LoRA: the update trains an adapter on the frozen base, engines load merged
weights, the KL reference is the base with the adapter off, and a run resumes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")

from catalog.query import query
from catalog.store import Catalog
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO, artifact

#: TINY_GRPO with groups of 4, a learning rate that moves the adapter, and a KL term
LORA = (
    TINY_GRPO.replace("seed: 3", "seed: 4")
    .replace("group_size: 2", "group_size: 4")
    .replace(
        "update: {optim: {lr: 1.0e-3, mini_batch_size: 4, micro_batch_size: 4}}",
        "update: {optim: {lr: 5.0e-2, mini_batch_size: 8, micro_batch_size: 4}, kl_coef: 0.05}",
    )
)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora")
    (folder / "spec.yaml").write_text(LORA)
    catalog = Catalog(str(folder / "catalog"))
    run_spec(str(folder / "spec.yaml"), catalog, ("model.lora.r=4",))
    return folder, catalog


def test_only_the_adapted_layers_change_and_the_checkpoint_keeps_the_adapter(lora_run):
    _, catalog = lora_run
    base_dir, after_dir = artifact(catalog, "warmstart-", None, "policy"), artifact(catalog, "update-", 1, "policy")
    info = json.loads((after_dir / "policy.json").read_text())
    assert info["version"] == 2 and info["lora"]["r"] == 4 and info["lora"]["base"].startswith("warmstart-")
    assert (after_dir / "adapter" / "adapter_model.safetensors").exists()
    base, after = load_file(str(base_dir / "model.safetensors")), load_file(str(after_dir / "model.safetensors"))
    changed = {k for k in base if not torch.equal(base[k], after[k])}
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in changed)
    adapter = load_file(str(after_dir / "adapter" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)


def test_the_stored_logprobs_equal_a_forward_pass_of_base_and_adapter(lora_run):
    from peft import PeftModel

    from stages.models.forward import sampled_logprobs
    from stages.models.policy import load_policy

    _, catalog = lora_run
    policy = artifact(catalog, "update-", 0, "policy")  # what iteration 1's rollout sampled with
    base, _ = load_policy(artifact(catalog, "warmstart-", None, "policy"), dtype="float32")
    model = PeftModel.from_pretrained(base, str(policy / "adapter")).eval()
    rows = query(catalog, "select token_ids, loss_mask, logprobs from trajectories where iteration = 1").to_pylist()
    assert rows
    for row in rows:
        ids = torch.tensor([row["token_ids"]])
        mask = torch.tensor([row["loss_mask"]])
        with torch.no_grad():
            logp, _ = sampled_logprobs(model, ids, torch.ones_like(ids), mask, torch.tensor([1.0]))
        sampled = mask[0].bool()
        assert torch.allclose(logp[0][sampled], torch.tensor(row["logprobs"])[sampled], atol=1e-4)


def test_the_kl_reference_is_the_base_with_the_adapter_off(lora_run):
    _, catalog = lora_run
    kl = query(catalog, "select iteration, value from metrics where name = 'actor/kl_ref' order by 1").to_pylist()
    assert [r["iteration"] for r in kl] == [0, 1]
    assert kl[0]["value"] == pytest.approx(0.0, abs=1e-6)  # a fresh adapter changes nothing yet
    assert kl[1]["value"] > 0  # the second update starts from a trained adapter


def test_a_lora_run_resumes_from_its_last_adapter(lora_run):
    folder, catalog = lora_run
    summary, display = run_spec(str(folder / "spec.yaml"), catalog, ("model.lora.r=4", "run.iterations=3"))
    assert (summary.ran, summary.cached) == (3, 8)  # only iteration 2 runs: its rollout, advantage, update
    assert all(e.status == "cached" for e in display.events if "2" not in e.label)
    info = json.loads((artifact(catalog, "update-", 2, "policy") / "policy.json").read_text())
    assert info["version"] == 3 and (artifact(catalog, "update-", 2, "policy") / "adapter").is_dir()


def test_a_lora_critic_shares_the_base(tmp_path):
    from tests.stages.conftest import TINY_STARPO

    (tmp_path / "spec.yaml").write_text(TINY_STARPO)
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "spec.yaml"), catalog, ("model.lora.r=4",))
    first, last = artifact(catalog, "critic_init-", None, "critic"), artifact(catalog, "critic_update-", 1, "critic")
    for folder in (first, last):
        assert not (folder / "model.safetensors").exists()  # no copy of the policy: an adapter and a head
        info = json.loads((folder / "critic.json").read_text())
        assert info["lora"]["r"] == 4 and info["base"].startswith("warmstart-")
    before = load_file(str(first / "adapter_model.safetensors"))
    after = load_file(str(last / "adapter_model.safetensors"))
    assert any("score" in k for k in after) and any(not torch.equal(before[k], after[k]) for k in before)
    values = query(catalog, "select count(*) from metrics where name = 'critic/value_loss'").column(0)[0].as_py()
    assert values == 2
