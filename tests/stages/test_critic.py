"""critic.init: the first critic is a function of its result's key."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from stages.critic import CriticInitConfig
from stages.registry import STAGES


def _init(tiny_policy: Path, folder: Path, seed: int) -> dict[str, torch.Tensor]:
    def output_dir(name: str) -> Path:
        (folder / name).mkdir(parents=True, exist_ok=True)
        return folder / name

    ctx = SimpleNamespace(seed=seed, output_dir=output_dir)
    policy = SimpleNamespace(local_path=lambda: tiny_policy, address="warmstart-x/policy")
    STAGES["critic.init"].fn(ctx, CriticInitConfig(), policy)
    return load_file(str(folder / "critic" / "model.safetensors"))


def test_the_value_head_starts_the_same_whatever_ran_before_in_the_process(tiny_policy: Path, tmp_path: Path) -> None:
    """A resumed run, or another node, computes critic.init in a process whose generator
    has drawn other numbers before: the head must not depend on them (it did, and a run
    resumed after a lost node trained from another critic than the undisturbed run)."""
    first = _init(tiny_policy, tmp_path / "a", seed=5)
    torch.rand(1000)  # what another process drew before
    state = torch.get_rng_state()
    again = _init(tiny_policy, tmp_path / "b", seed=5)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert torch.equal(torch.get_rng_state(), state), "the process's own generator was moved"
    other = _init(tiny_policy, tmp_path / "c", seed=6)
    assert any(not torch.equal(first[k], other[k]) for k in first), "the run seed draws the head"
