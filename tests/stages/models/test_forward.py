"""stages/models/forward.py: a prefix shared by every row is computed once, and
nothing changes but the compute (values, entropies, gradients)."""

from __future__ import annotations

import pytest
import torch

from stages.models import forward
from stages.models.forward import sampled_logprobs, shared_length
from stages.training.sft import Sample, sft_loss
from tests.stages.conftest import tiny_qwen2


def _batch(prefix: int = 12, rests: tuple[int, ...] = (3, 7, 1, 5, 4)):
    g = torch.Generator().manual_seed(1)
    head = torch.randint(0, 50, (prefix,), generator=g)
    rows = [torch.cat([head, torch.randint(0, 50, (k,), generator=g)]) for k in rests]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)], mask[i, prefix - 2 : len(r)] = r, 1, 1
    return ids, attention, mask


def _with_and_without_sharing(fn, monkeypatch):
    shared = fn()
    monkeypatch.setattr(forward, "MIN_SHARED", 10**9)
    return shared, fn()


@pytest.mark.parametrize("tie", [False, True])
def test_sharing_the_prefix_changes_no_logprob_entropy_or_gradient(monkeypatch, tie):
    model = tiny_qwen2(tie)
    ids, attention, mask = _batch()
    assert shared_length(ids, attention) == 12

    def run():
        logp, ent = sampled_logprobs(model, ids, attention, mask, torch.tensor([1.0, 0.7, 1.0, 0.5, 1.0]))
        grads = torch.autograd.grad(logp.sum() + ent.sum(), list(model.parameters()))
        return logp, ent, grads

    (lp1, e1, g1), (lp2, e2, g2) = _with_and_without_sharing(run, monkeypatch)
    assert torch.allclose(lp1, lp2, atol=1e-5) and torch.allclose(e1, e2, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g1, g2, strict=True))


def test_the_warm_start_loss_is_the_same_with_a_shared_prefix(monkeypatch):
    model = tiny_qwen2()
    ids, attention, _ = _batch()
    samples = []
    for row, real in zip(ids.tolist(), attention.sum(1).tolist(), strict=True):
        labels = [-100] * 11 + row[11:real]
        samples.append(Sample(row[:real], labels, ((real - 1, (3, 4, 5), 1),)))

    def run():
        loss = sft_loss(model, samples, pad=0, action_weight=1.0)
        return loss, torch.autograd.grad(loss, list(model.parameters()))

    (l1, g1), (l2, g2) = _with_and_without_sharing(run, monkeypatch)
    assert torch.allclose(l1, l2, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g1, g2, strict=True))


def test_the_shared_length_counts_real_tokens_and_leaves_each_row_one():
    ids = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 3, 5, 6], [1, 2, 9, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert shared_length(ids, attention) == 2
    assert shared_length(ids[:2], attention[:2]) == 3
    assert shared_length(torch.tensor([[1, 2], [1, 2]]), torch.ones(2, 2, dtype=torch.long)) == 1
    assert shared_length(ids[:1], attention[:1]) == 0  # one row: nothing to share
    pad = torch.tensor([[1, 2, 0, 0], [1, 2, 0, 0]])  # equal padding is not a shared prefix
    assert shared_length(pad, torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]])) == 1


def test_the_warm_start_loss_runs_the_head_only_where_a_label_is_predicted():
    import torch.nn.functional as F

    from stages.training.sft import sft_batch

    model = tiny_qwen2()
    ids, attention, _ = _batch()
    samples = []
    for row, real in zip(ids.tolist(), attention.sum(1).tolist(), strict=True):
        labels = [-100] * 11 + row[11:real]
        samples.append(Sample(row[:real], labels, ((real - 1, (3, 4, 5), 1), (real - 2, (3, 4, 5), 0))))
    got = sft_loss(model, samples, pad=0, action_weight=0.5)
    # the same loss from every position's logits
    batch_ids, attn, labels = sft_batch(samples, 0)
    logits = model(input_ids=batch_ids, attention_mask=attn).logits.float()
    tokens = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    rows = [i for i, s in enumerate(samples) for _ in s.actions]
    cols = [p - 1 for s in samples for p, _, _ in s.actions]
    targets = torch.tensor([t for s in samples for _, _, t in s.actions])
    actions = F.cross_entropy(logits[rows, cols][:, [3, 4, 5]], targets)
    assert torch.allclose(got, tokens + 0.5 * actions, atol=1e-5)
    bad = [Sample(samples[0].ids, [-100] * len(samples[0].ids), samples[0].actions), *samples[1:]]
    with pytest.raises(ValueError, match="outside the labelled tokens"):
        sft_loss(model, bad, pad=0, action_weight=1.0)


def test_a_bfloat16_model_divides_by_the_float32_temperature():
    """In bfloat16, 0.7 is 0.69921875: the temperature and the division stay float32, so
    a bf16 policy's log-probs are log_softmax(float32 logits / 0.7), as the engine's are."""
    model = tiny_qwen2(False).to(torch.bfloat16)
    ids, attention, mask = _batch()
    temps = torch.full((ids.shape[0],), 0.7)
    with torch.no_grad():
        logp, _ = sampled_logprobs(model, ids, attention, mask, temps)
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
    want = torch.log_softmax(logits[:, :-1] / 0.7, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    where = mask[:, 1:].bool()
    assert torch.allclose(logp[:, 1:][where], want[where], atol=2e-2)
    wrong = torch.log_softmax(logits[:, :-1] / torch.tensor(0.7, dtype=torch.bfloat16).float(), -1)
    wrong = wrong.gather(-1, ids[:, 1:, None])[..., 0]
    assert (logp[:, 1:][where] - want[where]).abs().mean() < (logp[:, 1:][where] - wrong[where]).abs().mean()
