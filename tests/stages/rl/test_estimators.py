import pytest
import torch

from stages.rl.estimators import gae, grpo, last_token, normalize_scores, rloo, whiten

S = torch.tensor([1.0, 3.0, 2.0, 2.0])
G = torch.tensor([0, 0, 1, 1])


def test_normalisation_by_hand():
    assert normalize_scores(S, G, "state", "mean").tolist() == [-1.0, 1.0, 0.0, 0.0]
    ms = normalize_scores(S, G, "state", "mean_std")
    assert torch.allclose(ms, torch.tensor([-1.0, 1.0, 0.0, 0.0]), atol=1e-5)  # std 1; zero-std group -> 0
    assert normalize_scores(S, G, "batch", "mean").tolist() == [-1.0, 1.0, 0.0, 0.0]
    assert normalize_scores(S, G, "none", "mean_std").tolist() == S.tolist()
    x = torch.tensor([0.0, 0.0, 0.0, 10.0])  # mean 2.5, std 4.33: z = -0.577.., 1.732
    clipped = normalize_scores(x, torch.zeros(4), "batch", "asym_clip")
    assert torch.allclose(clipped, torch.tensor([-0.57735, -0.57735, -0.57735, 1.73205]), atol=1e-4)
    y = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0])  # z of the outlier = 3.0 -> kept
    assert normalize_scores(y, torch.zeros(10), "batch", "asym_clip")[-1] == pytest.approx(3.0, abs=1e-4)
    y[-1], y[0] = 0.0, -100.0  # z of the low outlier = -3 -> clipped to -1
    assert normalize_scores(y, torch.zeros(10), "batch", "asym_clip")[0] == pytest.approx(-1.0)


def test_gae_by_hand():
    # one row, sampled tokens at 1, 2 and 4 (3 is template text); reward 1 at the end
    mask = torch.tensor([[0, 1, 1, 0, 1]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.0, 0.5, 0.25, 9.0, 0.5]])
    # gamma = 0.9, lam = 0.5: deltas (backwards) t4: 1 - 0.5 = 0.5; t2: 0.9*0.5 - 0.25 = 0.2;
    # t1: 0.9*0.25 - 0.5 = -0.275. A4 = 0.5; A2 = 0.2 + 0.45*0.5 = 0.425; A1 = -0.275 + 0.45*0.425 = -0.08375
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    raw = torch.tensor([-0.08375, 0.425, 0.5])
    assert torch.allclose(ret[0, [1, 2, 4]], raw + torch.tensor([0.5, 0.25, 0.5]))
    assert ret[0, 0] == 0 and ret[0, 3] == 0 and adv[0, 3] == 0
    assert torch.allclose(adv[0, [1, 2, 4]], (raw - raw.mean()) / raw.std(unbiased=False), atol=1e-4)


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    mask = torch.ones(1, 3, dtype=torch.long)
    rewards = torch.tensor([[0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 1.5]])
    _, ret = gae(rewards, values, mask, 1.0, 1.0)
    assert torch.allclose(ret, torch.tensor([[2.0, 2.0, 2.0]]))  # the score, at every token


def test_grpo_and_rloo_broadcast_over_sampled_tokens():
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 1, 1]])
    adv = grpo(S, G, mask)
    assert torch.allclose(adv[0], torch.tensor([-1.0, 0.0, -1.0]), atol=1e-5) and adv[2].abs().sum() == 0
    loo = rloo(torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([0, 0, 0, 1]), mask)
    # group 0: 1 - 4 = -3, 3 - 3 = 0, 5 - 2 = 3; a group of one -> 0
    assert loo[:, -1].tolist() == [-3.0, 0.0, 3.0, 0.0] and loo[0, 1] == 0


def test_last_token_and_whiten():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1]])
    assert last_token(mask).tolist() == [1, 3]
    w = whiten(torch.tensor([[1.0, 3.0, 50.0, 50.0], [0.0, 1.0, 50.0, 3.0]]), mask)
    kept = w[mask.bool()]
    assert abs(kept.mean()) < 1e-6 and abs(kept.std(unbiased=False) - 1) < 1e-4 and w[0, 2] == 0


def test_turn_spans_and_token_rewards():
    from stages.rl.estimators import token_rewards, turn_spans

    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 0, 1, 1, 0]])
    assert turn_spans(mask[0]) == [(1, 2), (5, 5)] and turn_spans(mask[1]) == [(2, 2), (4, 5)]
    scores, norm = torch.tensor([3.0, -1.0]), torch.tensor([1.0, -1.0])
    traj = token_rewards(mask, scores, norm, None)
    assert traj[0].tolist() == [0, 0, 0, 0, 0, 1.0, 0] and traj[1, 5] == -1.0 and traj.sum() == 0
    # turn-level: rewards 1 and 2 (score 3) normalised to 1: the -2 shift lands on the last turn
    turns = token_rewards(mask, scores, norm, [[1.0, 2.0], [-0.5, -0.5]])
    assert turns[0].tolist() == [0, 0, 1.0, 0, 0, 0.0, 0]
    assert turns[1].tolist() == [0, 0, -0.5, 0, 0, -0.5, 0]


def test_bi_level_gae_by_hand():
    from stages.rl.estimators import bi_level_gae

    # two turns: tokens 1-2 (reward 1 at 2), token 4 (reward 2); values at 1, 2, 4 = 0.5, 0.25, 1.0
    mask = torch.tensor([[0, 1, 1, 0, 1]])
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0, 2.0]])
    values = torch.tensor([[0.0, 0.5, 0.25, 7.0, 1.0]])
    # turn level (turn_gamma 0.5, turn_lam 1): V1 = 0.5, V2 = 1.0
    #   k=2: A = 2 - 1 = 1, G2 = 2;  k=1: A = 1 + 0.5*1.0 - 0.5 + 0.5*1 = 1.5, G1 = 2
    # token level (gamma 1, lam 0.5), turn 2: target 2 + 0.5*0 = 2 -> A4 = 2 - 1 = 1
    #   turn 1: target at 2 = 1 + 0.5*G2 = 2 -> A2 = 2 - 0.25 = 1.75; A1 = 0.25 - 0.5 + 0.5*1.75 = 0.625
    adv, ret = bi_level_gae(rewards, values, mask, gamma=1.0, lam=0.5, turn_gamma=0.5, turn_lam=1.0)
    raw = torch.tensor([0.625, 1.75, 1.0])
    assert torch.allclose(ret[0, [1, 2, 4]], raw + torch.tensor([0.5, 0.25, 1.0]))
    assert torch.allclose(adv[0, [1, 2, 4]], (raw - raw.mean()) / raw.std(unbiased=False), atol=1e-4)


def test_bi_level_gae_with_all_factors_one_is_gae():
    from stages.rl.estimators import bi_level_gae

    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 0, 1, 0]])
    rewards = torch.zeros(2, 8)
    rewards[0, 2], rewards[0, 5], rewards[0, 7], rewards[1, 4], rewards[1, 6] = 1.0, -0.5, 2.0, 0.3, 1.0
    values = torch.randn(2, 8)
    a, r = bi_level_gae(rewards, values, mask, 1.0, 1.0, 1.0, 1.0)
    b, s = gae(rewards, values, mask, 1.0, 1.0)
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(r, s, atol=1e-5)


def test_reinforce_pp_by_hand():
    from stages.rl.estimators import reinforce_pp

    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    rewards = torch.tensor([[0.0, 0.0, 2.0], [0.0, -1.0, 0.0]])
    # returns-to-go (gamma 0.5): row 0: t2 = 2, t0 = 0 + 0.5*2 = 1; row 1: t1 = -1, t0 = -0.5
    raw = torch.tensor([1.0, 2.0, -0.5, -1.0])
    out = reinforce_pp(rewards, mask, gamma=0.5)
    assert torch.allclose(out[mask.bool()], (raw - raw.mean()) / raw.std(unbiased=False), atol=1e-4)
    assert out[0, 1] == 0 and out[1, 2] == 0


def test_estimator_table():
    from stages.rl.estimators import AdvantageBatch, Discount
    from stages.rl.registry import ESTIMATORS

    mask = torch.ones(4, 2, dtype=torch.long)
    batch = AdvantageBatch(S, G, mask, torch.zeros(4, 2), None)
    assert set(ESTIMATORS) == {"gae", "bi_level_gae", "grpo", "rloo", "reinforce_pp", "gigpo"}
    adv, ret = ESTIMATORS["grpo"](batch, Discount())
    assert ret is None and adv[0, 0] == pytest.approx(-1.0, abs=1e-4)
    with pytest.raises(ValueError, match="needs the critic"):
        ESTIMATORS["gae"](batch, Discount())
    with pytest.raises(ValueError, match="needs the turns"):
        ESTIMATORS["gigpo"](batch, Discount())


def test_gigpo_by_hand():
    from stages.rl.estimators import gigpo

    # one group of three trajectories from state "a"; turns' sampled tokens are the 1-runs of the mask
    mask = torch.tensor(
        [
            [1, 0, 1, 1, 0],  # turns at 0 and 2..3
            [1, 1, 0, 1, 0],  # turns at 0..1 and 3
            [1, 0, 0, 0, 0],
        ]
    )  # one turn
    states = [["a", "b"], ["a", "b"], ["a"]]
    rewards = [[0.0, 1.0], [0.0, 0.0], [-0.5]]
    scores = torch.tensor([1.0, 0.0, -0.5])
    adv = gigpo(scores, torch.zeros(3, dtype=torch.long), mask, states, rewards, gamma=0.5, weight=2.0)
    # episode level: mean 1/6, std 0.6236: z = 1.3363, -0.2673, -1.0690
    ep = (scores - scores.mean()) / scores.std(unbiased=False)
    # step returns with gamma 0.5: anchor a: 0.5, 0.0, -0.5 -> z = 1.2247, 0, -1.2247; anchor b: 1.0, 0.0 -> z = 1, -1
    za = torch.tensor([1.2247, 0.0, -1.2247])
    expected = torch.tensor(
        [
            [ep[0] + 2 * za[0], 0, ep[0] + 2, ep[0] + 2, 0],
            [ep[1] + 2 * za[1], ep[1] + 2 * za[1], 0, ep[1] - 2, 0],
            [ep[2] + 2 * za[2], 0, 0, 0, 0],
        ]
    )
    assert torch.allclose(adv, expected, atol=1e-3)
    # a state met by one turn only, or with equal returns, adds nothing: gigpo is then grpo
    same = gigpo(scores, torch.zeros(3, dtype=torch.long), mask, [["x"], ["y"], ["z"]], [[1.0], [0.0], [0.5]], 1.0, 1.0)
    assert torch.allclose(same, grpo(scores, torch.zeros(3, dtype=torch.long), mask), atol=1e-6)


def _row_by_row(rewards, values, mask, gamma, lam):
    """GAE one row and one token at a time, skipping tokens off the mask (the reference)."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        running, next_value = 0.0, 0.0
        for t in range(rewards.shape[1] - 1, -1, -1):
            if mask[b, t]:
                running = rewards[b, t] + gamma * next_value - values[b, t] + gamma * lam * running
                adv[b, t], next_value = running, values[b, t]
    return adv


def test_batched_gae_and_reinforce_pp_equal_the_row_by_row_loop():
    from stages.rl.estimators import reinforce_pp

    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(6, 20, generator=g), torch.randn(6, 20, generator=g)
    mask = (torch.rand(6, 20, generator=g) < 0.6).float()
    mask[5] = 0  # a row with no sampled token
    raw = _row_by_row(rewards, values, mask, 0.9, 0.8)
    adv, ret = gae(rewards, values, mask, 0.9, 0.8)
    assert torch.allclose(adv, whiten(raw, mask), atol=1e-5)
    assert torch.allclose(ret, (raw + values) * mask, atol=1e-5)
    # REINFORCE++ is GAE with zero values and lam = 1
    assert torch.allclose(
        reinforce_pp(rewards, mask, 0.9),
        whiten(_row_by_row(rewards, torch.zeros_like(values), mask, 0.9, 1.0), mask),
        atol=1e-5,
    )


def test_every_estimator_and_normalisation_is_declared_for_the_config_checks():
    import typing

    from stages.advantage import AdvantageConfig
    from stages.rl.registry import ESTIMATORS, METHODS

    hints = typing.get_type_hints(AdvantageConfig)  # the config's choices are the registries' entries
    ESTIMATOR_NEEDS, NORMALIZATIONS = typing.get_args(hints["estimator"]), typing.get_args(hints["method"])

    assert set(ESTIMATOR_NEEDS) == set(ESTIMATORS) and set(NORMALIZATIONS) == set(METHODS)


def _over_every_token(rewards, values, mask, gamma, lam):
    """GAE as a loop over every token of the batch, every row at once (what `gae` ran
    before it packed the sampled tokens): the same operations per row, in the same order."""
    adv = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    next_value = torch.zeros_like(running)
    for t in range(rewards.shape[1] - 1, -1, -1):
        on = mask[:, t].bool()
        step = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        running = torch.where(on, step, running)
        adv[:, t] = torch.where(on, step, adv[:, t])
        next_value = torch.where(on, values[:, t], next_value)
    return whiten(adv, mask), (adv + values) * mask


def test_gae_over_packed_sampled_tokens_is_bit_for_bit_the_loop_over_every_token():
    from stages.rl.estimators import packed, reinforce_pp

    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        # multi-turn rows: runs of sampled tokens between prompt and observation tokens, of unequal lengths
        mask = torch.zeros(5, 300)
        for b, spans in enumerate([[(10, 40), (90, 120)], [(5, 6)], [], [(0, 299)], [(50, 60), (70, 71), (200, 250)]]):
            for lo, hi in spans:
                mask[b, lo:hi] = 1
        rewards, values = torch.randn(5, 300, generator=g, dtype=dtype), torch.randn(5, 300, generator=g, dtype=dtype)
        for got, want in zip(
            gae(rewards, values, mask, 0.99, 0.95), _over_every_token(rewards, values, mask, 0.99, 0.95)
        ):
            assert torch.equal(got, want)
        zeros = torch.zeros_like(values)
        assert torch.equal(reinforce_pp(rewards, mask, 0.9), _over_every_token(rewards, zeros, mask, 0.9, 1.0)[0])
    index, on = packed(mask)
    assert index.shape == (5, 299) and on.sum(dim=1).tolist() == mask.sum(dim=1).int().tolist()
    assert all(len(set(row)) == len(row) for row in index.tolist())  # each position once: the scatter loses nothing
    assert torch.equal(index[1, :1], torch.tensor([5])) and not on[2].any()
    assert packed(torch.zeros(0, 7))[0].shape == (0, 0)
