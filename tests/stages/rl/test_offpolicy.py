"""Per-decision weighted importance sampling against values known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stages.rl.offpolicy import estimate, pdwis, turn_sums


def test_on_policy_is_the_sample_mean_with_full_ess() -> None:
    rewards = [[0.0, 1.0], [0.5], [0.0, 0.0, 0.2]]
    est = estimate([[0.0] * len(r) for r in rewards], rewards, [True, False, False], boot=200)
    assert est.success == pytest.approx(1 / 3)
    assert est.score == pytest.approx((1.0 + 0.5 + 0.2) / 3)
    assert est.ess == pytest.approx(3.0) and est.episodes == 3
    assert est.success_ci[0] <= est.success <= est.success_ci[1]


def test_pdwis_by_hand() -> None:
    # two trajectories of two turns; turn weights exp(cumulative log ratios)
    log_rho = np.log(np.array([[2.0, 1.0], [0.5, 1.5]]))
    rewards = np.array([[1.0, 0.0], [0.0, 1.0]])
    by_hand = (2.0 * 1 + 0.5 * 0) / 2.5 + (1.0 * 0 + 1.5 * 1) / 2.5
    assert pdwis(log_rho, rewards) == pytest.approx(by_hand)
    est = estimate([[math.log(2.0), math.log(0.5)], [math.log(0.5), math.log(3.0)]], rewards.tolist(), [False, True])
    assert est.score == pytest.approx(by_hand)
    assert est.ess == pytest.approx((1.0 + 1.5) ** 2 / (1.0 + 1.5**2))


def test_a_bandit_target_value_is_recovered_from_behaviour_samples() -> None:
    rng = np.random.default_rng(0)
    behaviour, target = np.array([0.25] * 4), np.array([0.1, 0.7, 0.1, 0.1])
    win = np.array([0.0, 1.0, 0.0, 0.0])  # action 1 wins
    actions = rng.choice(4, size=2000, p=behaviour)
    ratios = [[math.log(target[a] / behaviour[a])] for a in actions]
    est = estimate(ratios, [[win[a]] for a in actions], [bool(win[a]) for a in actions], boot=300)
    assert est.success_ci[0] <= 0.7 <= est.success_ci[1]
    assert abs(est.success - 0.7) < 0.05


def test_two_turn_episodes_per_decision() -> None:
    # turn 1: a in {0, 1}, reward 0.5 for 1; turn 2 only after a = 1: b in {0, 1}, success for b = 1
    rng = np.random.default_rng(1)
    pb1, pt1, pb2, pt2 = 0.5, 0.8, 0.5, 0.9
    true = pt1 * 0.5 + pt1 * pt2  # expected score: 0.5 for turn 1's a = 1, 1 more for success
    ratios, rewards, success = [], [], []
    for _ in range(4000):
        a = rng.random() < pb1
        r1 = math.log((pt1 if a else 1 - pt1) / (pb1 if a else 1 - pb1))
        if not a:
            ratios.append([r1]), rewards.append([0.0]), success.append(False)
            continue
        b = rng.random() < pb2
        r2 = math.log((pt2 if b else 1 - pt2) / (pb2 if b else 1 - pb2))
        ratios.append([r1, r2]), rewards.append([0.5, 1.0 if b else 0.0]), success.append(bool(b))
    est = estimate(ratios, rewards, success, boot=300)
    assert est.score_ci[0] <= true <= est.score_ci[1]
    assert est.success_ci[0] <= pt1 * pt2 <= est.success_ci[1]


def test_turn_sums_follow_the_mask_runs() -> None:
    assert turn_sums([1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 0]) == [5.0, 5.0]
    assert turn_sums([1, 2], [0, 0]) == []
    with pytest.raises(ValueError):
        estimate([[0.0]], [], [True])
