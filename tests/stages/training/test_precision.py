"""Mixed precision and gradient checkpointing (`optim.precision`, `optim.gradient_checkpointing`,
stages/training/fit.py), seen on CPU: bfloat16 autocast exists there too."""

from __future__ import annotations

import copy

import torch

from stages.models.forward import sampled_logprobs
from stages.training.fit import OptimConfig, autocast, prepare
from tests.stages.conftest import tiny_qwen2
from tests.stages.models.test_forward import _batch


def _loss_and_grads(model, optim: OptimConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor], set[torch.dtype]]:
    ids, attention, mask = _batch()
    seen: set[torch.dtype] = set()
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    model.train()
    prepare(model, optim)
    with autocast(optim, "cpu"):
        logp, _ = sampled_logprobs(model, ids, attention, mask, torch.full((ids.shape[0],), 0.7))
    loss = -(logp * mask).sum() / mask.sum()
    loss.backward()
    hook.remove()
    return logp, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, seen


def test_bf16_mixed_runs_the_forward_in_bfloat16_and_keeps_float32_weights_and_log_probs():
    model = tiny_qwen2(False)
    logp, grads, seen = _loss_and_grads(model, OptimConfig(precision="bf16-mixed"))
    assert seen == {torch.bfloat16}
    assert logp.dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    _, _, plain = _loss_and_grads(tiny_qwen2(False), OptimConfig())
    assert plain == {torch.float32}


def test_gradient_checkpointing_gives_the_same_gradients_through_the_shared_prefix_forward():
    """The adversary: the prefix-sharing forward (`decoder_hidden`) with activations
    recomputed in the backward pass: the gradients must not change."""
    model = tiny_qwen2(False)
    twin = copy.deepcopy(model)
    _, plain, _ = _loss_and_grads(model, OptimConfig())
    _, checkpointed, _ = _loss_and_grads(twin, OptimConfig(gradient_checkpointing=True))
    assert twin.is_gradient_checkpointing
    assert plain.keys() == checkpointed.keys()
    assert all(torch.allclose(plain[n], checkpointed[n], atol=1e-6) for n in plain)
