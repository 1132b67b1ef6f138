import math

import pytest
import torch

from stages.rl.losses import (
    aggregate,
    explained_variance,
    kl_k1,
    kl_k3,
    masked_mean,
    ppo_policy_loss,
    token_logprobs,
    value_loss,
)


def test_aggregation_by_hand_and_split_into_micro_batches():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4; seq-mean-token-mean: (2 + 4) / 2
    assert aggregate(x, mask, "token-mean", 4, 2) == pytest.approx(2.5)
    assert aggregate(x, mask, "seq-mean-token-mean", 4, 2) == pytest.approx(3.0)
    for mode in ("token-mean", "seq-mean-token-mean"):
        parts = aggregate(x[:1], mask[:1], mode, 4, 2) + aggregate(x[1:], mask[1:], mode, 4, 2)
        assert parts == pytest.approx(float(aggregate(x, mask, mode, 4, 2)))
    assert masked_mean(x, mask) == pytest.approx(2.5)


def test_ppo_loss_decoupled_and_dual_clip_by_hand():
    ratios = torch.tensor([[1.5, 0.5, 5.0, 1.0, 1.1]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, -2.0]])
    old = torch.zeros_like(ratios)
    t = ppo_policy_loss(torch.log(ratios), old, adv, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    # 1.5, A>0: -min(1.5, 1.28) = -1.28 (upper clip binds)
    # 0.5, A<0: max(0.5, 0.8) = 0.8 (lower clip binds)
    # 5.0, A<0: max(5, 1.28) = 5, dual clip: min(5, 3) = 3
    # 1.0, A>0: -1;  1.1, A=-2: max(2.2, 2.2) = 2.2 (inside the bounds)
    assert torch.allclose(t.loss, torch.tensor([[-1.28, 0.8, 3.0, -1.0, 2.2]]))
    assert t.clipped_high.tolist() == [[True, False, False, False, False]]
    assert t.clipped_low.tolist() == [[False, True, False, False, False]]
    assert t.dual_clipped.tolist() == [[False, False, True, False, False]]
    assert torch.allclose(t.approx_kl, -torch.log(ratios))
    off = ppo_policy_loss(torch.log(ratios), old, adv, 0.2, 0.28, None)
    assert off.loss[0, 2] == pytest.approx(5.0) and not off.dual_clipped.any()
    symmetric = ppo_policy_loss(torch.log(ratios), old, adv, 0.2, 0.2, 3.0)
    assert symmetric.loss[0, 0] == pytest.approx(-1.2)


def test_ppo_gradient_is_zero_where_clipped():
    logp = torch.log(torch.tensor([1.5, 1.1])).requires_grad_()
    t = ppo_policy_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), 0.2, 0.28, 3.0)
    t.loss.sum().backward()
    assert logp.grad[0] == 0 and logp.grad[1] == pytest.approx(-1.1)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0])
    assert kl_k1(logp, ref).tolist() == [1.0, 0.0]
    # k3: d = ref - logp = -1: e^-1 + 1 - 1 = 0.36788; d = 0 -> 0
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([math.exp(-1), 0.0]), atol=1e-6)
    assert (kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()


def test_value_loss_by_hand():
    values, old, ret = torch.tensor([2.0, 2.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.0, 3.0, 3.0])
    loss, clipped = value_loss(values, old, ret, clip=0.5)
    # v=2, R=0: plain 4, clipped v 1.5 -> 2.25: 0.5*4 = 2
    # v=2, R=3: plain 1, clipped v 1.5 -> 2.25 wins: 1.125
    # v=0, R=3: plain 9, clipped v 0.5 -> 6.25: 4.5
    assert torch.allclose(loss, torch.tensor([2.0, 1.125, 4.5]))
    assert clipped.tolist() == [False, True, False]
    assert torch.allclose(value_loss(values, old, ret, None)[0], torch.tensor([2.0, 0.5, 4.5]))


def test_token_logprobs_alignment_and_entropy():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(token 2 at position 1) = 3/6
    ids = torch.tensor([[0, 2, 1]])
    logp, ent = token_logprobs(logits, ids)
    assert (
        logp[0, 0] == 0 and logp[0, 1] == pytest.approx(math.log(0.5)) and logp[0, 2] == pytest.approx(math.log(0.25))
    )
    assert ent[0, 2] == pytest.approx(math.log(4.0))
    hot, _ = token_logprobs(logits, ids, temperature=0.5)
    assert hot[0, 1] == pytest.approx(math.log(9 / 12))  # logits / 0.5: 3^2 = 9 vs three 1s


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(ret) + 2.0, ret, mask) == pytest.approx(0.0)


def test_decoupled_objective_by_hand_and_equal_to_ppo_without_staleness():
    from stages.rl.losses import behaviour_weight

    behaviour = torch.log(torch.tensor([[0.2, 0.5, 0.4]]))  # the stale policy that sampled
    prox = torch.log(torch.tensor([[0.3, 0.25, 2.0]]))  # the policy being updated, before the update
    logp = torch.log(torch.tensor([[0.36, 0.25, 1.0]]))  # the policy now
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    w = behaviour_weight(prox, behaviour, cap=2.0)
    # pi_prox / pi_behaviour: 1.5, 0.5, 5 -> truncated at 2
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 2.0]]))
    terms = ppo_policy_loss(logp, prox, adv, 0.2, 0.28, 3.0)
    # ratios against the proximal policy: 1.2 (A>0: -1.2), 1.0 (A<0: 1.0), 0.5 (A>0: -min(0.5, 0.8) = -0.5)
    assert torch.allclose(w * terms.loss, torch.tensor([[-1.8, 0.5, -1.0]]))
    # no staleness: the proximal policy is the behaviour policy, the weight is 1, the loss is PPO's
    same = behaviour_weight(behaviour, behaviour, cap=2.0)
    ppo = ppo_policy_loss(logp, behaviour, adv, 0.2, 0.28, 3.0).loss
    assert torch.equal(same, torch.ones_like(same)) and torch.equal(same * ppo, ppo)
