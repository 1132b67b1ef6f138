"""`optim.strategy: fsdp`: updates sharded over two Ray Train workers with FSDP2 equal
the same updates in one process (local mode), on CPU over gloo: the policy with a LoRA
adapter and its KL term, the critic, the optimiser state saved in the unsharded form,
and checkpoints that stay plain Hugging Face folders. (Two iterations, which load that
state back, passed as well; one keeps the suite short.)
Each optimiser step takes the whole batch (one mini-batch): each worker then steps on
its shard, and the loss is normalised by the tokens of all workers, so the sharded
gradients, summed, are the one process's (with mini-batches smaller than the batch, two
workers draw theirs from their own shards, not one process's). DDP over two workers
equals FSDP on the model level (tests/stages/training/test_sharding.py); a fit over
workers costs about 30 CPU-seconds here, so this test runs two, not four."""

from __future__ import annotations

import pytest
import torch

from catalog.store import Catalog
from stages.training.fit import OptimConfig
from tests.conftest import run_spec
from tests.stages.conftest import TINY_STARPO

COMMON = (
    "run.iterations=1",
    "model.lora.r=4",
    "pipeline.eval=null",
    "pipeline.eval_start=null",
    "update.optim.mini_batch_size=64",  # the whole batch: see the module docstring
    "critic.optim.mini_batch_size=64",
)
#: run name -> its settings: the updates in this process, and sharded over two workers
SETTINGS = {
    "local": tuple(f"{n}.optim.workers=0" for n in ("update", "critic")),
    "fsdp": tuple(f"{n}.optim.{k}" for n in ("update", "critic") for k in ("workers=2", "strategy=fsdp")),
}


def _keys(catalog: Catalog, run: str) -> list[str]:
    """The result keys of run `run`'s steps (both runs share one catalog)."""
    from catalog.query import query

    return [r["key"] for r in query(catalog, f"select key from steps where run = '{run}' order by all").to_pylist()]


def _final(catalog: Catalog, run: str, prefix: str, output: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    key = next(k for k in _keys(catalog, run) if k.startswith(prefix) and catalog.manifest(k)["iteration"] == 0)
    folder = catalog.ref(key, output).local_path()
    weights = {}
    for f in sorted(folder.rglob("*.safetensors")):  # the merged policy and its adapter, or the critic
        weights |= {f"{f.relative_to(folder)}:{k}": v for k, v in load_file(f).items()}
    return weights


def _metric(catalog: Catalog, run: str, name: str) -> dict[int, float]:
    """The metric `name` of each iteration's result of run `run` that reports it."""
    manifests = [catalog.manifest(k) for k in _keys(catalog, run)]
    return {m["iteration"]: m["metrics"][name] for m in manifests if name in m["metrics"]}


def test_fsdp_trains_policy_adapter_and_critic_as_one_process_does(spec_file, tmp_path, shared_ray):
    from stages.models.policy import load_policy

    spec = spec_file(TINY_STARPO)
    catalog = Catalog(str(tmp_path / "catalog"))
    for name, settings in SETTINGS.items():  # in one Ray session and one catalog: the steps before the updates
        run_spec(spec, catalog, (*COMMON, *settings, f"run.name={name}"))  # are computed once
    assert set(_keys(catalog, "local")).isdisjoint(
        k for k in _keys(catalog, "fsdp") if k.startswith(("update-", "critic_update-"))
    )
    for prefix, output in (("update-", "policy"), ("critic_update-", "critic")):
        one, fsdp = _final(catalog, "local", prefix, output), _final(catalog, "fsdp", prefix, output)
        assert one.keys() == fsdp.keys() and len(one) > 0
        # the same sums in another order (reduce-scatter, then times the workers): float32 noise; the lr of
        # 1e-3 moves these weights by ~1e-3, so a wrong gradient (a missing factor, a lost shard) shows
        assert all(torch.allclose(one[k], fsdp[k], atol=1e-5) for k in one), prefix
    # Adam is nearly blind to a gradient's scale, so the weights alone would miss a lost factor of 2: the
    # gradient norms (before clipping) must agree too
    for name in ("actor/grad_norm", "critic/grad_norm"):
        one_norms, fsdp_norms = _metric(catalog, "local", name), _metric(catalog, "fsdp", name)
        assert one_norms.keys() == fsdp_norms.keys() == {0}, (one_norms, fsdp_norms)
        assert all(abs(one_norms[i] - fsdp_norms[i]) <= 1e-4 * one_norms[i] for i in one_norms), name
    # the optimiser state is saved as an unsharded AdamW's: the same indices and moments as the one process's
    for prefix, output in (("update-", "policy"), ("critic_update-", "critic")):
        states = {}
        for run in SETTINGS:
            key = next(k for k in _keys(catalog, run) if k.startswith(prefix))
            states[run] = torch.load(catalog.ref(key, output).local_path() / "optimizer.pt")
        one_state, fsdp_state = states["local"], states["fsdp"]
        assert one_state["state"].keys() == fsdp_state["state"].keys() and len(one_state["state"]) > 0
        for i, moments in one_state["state"].items():
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.allclose(moments[name], fsdp_state["state"][i][name], atol=1e-6, rtol=1e-4), (prefix, i)
    # the sharded run's checkpoint is a plain folder transformers loads
    key = next(k for k in _keys(catalog, "fsdp") if k.startswith("update-"))
    model, _ = load_policy(catalog.ref(key, "policy").local_path())
    assert sum(p.numel() for p in model.parameters()) > 0


def test_fsdp_needs_two_workers():
    from common.config import ConfigProblem

    with pytest.raises(ConfigProblem, match="workers >= 2"):
        OptimConfig(strategy="fsdp", workers=1)
