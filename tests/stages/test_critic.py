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


def test_the_critic_kept_in_this_process_trains_as_a_ray_train_fit_does(spec_file, tmp_path, monkeypatch):
    """Three critic updates on the critic this process holds (`critic_trainer`: no fit, no
    load after the first) and three through a Ray Train fit in local mode, each from the
    stored version before it: byte-identical weights and the same AdamW state at every
    version, and so the same advantages, and the same policy at the end."""
    import ray

    from catalog.store import Catalog
    from stages.training import critic_trainer
    from stages.training import fit as train
    from tests.conftest import run_spec
    from tests.stages.conftest import TINY_STARPO

    fits: list[str] = []
    real_fit = train.fit
    monkeypatch.setattr(train, "fit", lambda ctx, loop, *a: fits.append(loop.__name__) or real_fit(ctx, loop, *a))
    runs = {}
    try:
        for held in ("true", "false"):
            critic_trainer.drop()
            fits.clear()
            runs[held] = Catalog(str(tmp_path / held))
            quick = ("run.iterations=3", "pipeline.eval=null", "pipeline.eval_start=null")
            run_spec(spec_file(TINY_STARPO), runs[held], (*quick, f"critic.resident={held}"))
            assert fits.count("critic_loop") == (0 if held == "true" else 3), fits
    finally:
        ray.shutdown()

    def by_iteration(catalog: Catalog, prefix: str, output: str) -> list[Path]:
        keys = sorted((catalog.manifest(k)["iteration"], k) for k in catalog.result_keys() if k.startswith(prefix))
        return [catalog.ref(k, output).local_path() for _, k in keys]

    kept, fitted = (
        by_iteration(runs["true"], "critic_update-", "critic"),
        by_iteration(runs["false"], "critic_update-", "critic"),
    )
    assert len(kept) == len(fitted) == 3
    for a, b in zip(kept, fitted):
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
        sa, sb = torch.load(a / "optimizer.pt"), torch.load(b / "optimizer.pt")
        assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
        assert all(torch.equal(sa["state"][i][n], sb["state"][i][n]) for i in sa["state"] for n in sa["state"][i])
    last = [by_iteration(runs[h], "update-", "policy")[-1] / "model.safetensors" for h in ("true", "false")]
    assert last[0].read_bytes() == last[1].read_bytes()
