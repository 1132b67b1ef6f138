"""The template-collapse diagnostic on constructed policies: the policies are torch
modules with the interface `stages.models.forward` uses, so the matrix comes from the
same forward pass as in a run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stages.models.forward import cross_logprobs, passes
from stages.rl.mutual_info import cross_score_metrics, distinct_prompt_rows, prompt_response

V = 8  # vocabulary: tokens 0..5 are states / answers, 6 and 7 are filler


class Constructed(torch.nn.Module):
    """A policy whose next-token logits are `head(one_hot(first prompt token))`:
    'sharpened' answers each state s with token s (deterministic, input-dependent),
    'template' answers 5 whatever the state, 'uniform' samples every token alike."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.config = SimpleNamespace()
        self.head = torch.nn.Linear(V, V)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()
            if kind == "sharpened":
                self.head.weight.copy_(30 * torch.eye(V))
            elif kind == "template":
                self.head.bias[5] = 30.0

    def get_decoder(self) -> object:
        def decode(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
            state = torch.nn.functional.one_hot(input_ids[:, :1], V).float().expand(-1, input_ids.shape[1], -1)
            return SimpleNamespace(last_hidden_state=state)

        return decode

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def sample(self, prompt: tuple[int, ...], rng: np.random.Generator) -> tuple[int, ...]:
        logits = self.head(torch.nn.functional.one_hot(torch.tensor(prompt[0]), V).float())
        return (int(rng.choice(V, p=torch.softmax(logits, -1).detach().numpy().astype(float))),)


def diagnose(kind: str, n: int = 6) -> dict[str, float]:
    policy = Constructed(kind)
    prompts = [(s, 6, 7, 6) for s in range(n)]  # states whose right answers differ
    rng = np.random.default_rng(0)
    responses = [policy.sample(p, rng) for p in prompts]
    ll = cross_logprobs(policy, prompts, responses, [1.0] * n, micro=7)
    return cross_score_metrics(ll, np.ones(n))


def test_template_collapse_has_no_mutual_information_and_chance_retrieval() -> None:
    m = diagnose("template")
    assert m["template/mi"] == pytest.approx(0.0, abs=1e-6)
    assert m["template/retrieval"] == pytest.approx(1 / 6)
    assert m["template/retrieval_over_chance"] == pytest.approx(1.0)
    assert m["template/cond_entropy"] < 1e-6  # deterministic: entropy alone would call it sharp


def test_sharpened_policy_has_full_mutual_information_despite_low_entropy() -> None:
    m = diagnose("sharpened")
    assert m["template/mi"] == pytest.approx(math.log(6), abs=1e-3)
    assert m["template/retrieval"] == 1.0
    assert m["template/cond_entropy"] < 1e-6


def test_uniform_policy_has_high_entropy_and_no_mutual_information() -> None:
    m = diagnose("uniform")
    assert m["template/mi"] == pytest.approx(0.0, abs=1e-6)
    assert m["template/retrieval"] == pytest.approx(1 / 6)
    assert m["template/cond_entropy"] == pytest.approx(math.log(V), abs=1e-5)


def test_metrics_by_hand() -> None:
    ll = np.array([[-1.0, -3.0], [-2.0, -1.0]])
    m = cross_score_metrics(ll, np.array([1, 2]))
    # response 0: -1 - log((e^-1 + e^-2) / 2); response 1: -1 - log((e^-3 + e^-1) / 2)
    g0 = -1 - math.log((math.exp(-1) + math.exp(-2)) / 2)
    g1 = -1 - math.log((math.exp(-3) + math.exp(-1)) / 2)
    assert m["template/mi"] == pytest.approx((g0 + g1) / 2)
    assert m["template/mi_per_token"] == pytest.approx((g0 + g1 / 2) / 2)
    assert m["template/retrieval"] == 1.0 and m["template/cond_entropy"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        cross_score_metrics(np.zeros((1, 1)), np.ones(1))


def test_prompt_and_response_split_at_the_first_sampled_run() -> None:
    assert prompt_response([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1]) == ((1, 2), (3, 4))
    assert prompt_response([1, 2], [0, 0]) is None


def test_pairs_have_distinct_prompts() -> None:
    prompts = [(1,), (1,), (2,), (3,), (3,), (3,)]
    rows = distinct_prompt_rows(prompts, 16, seed=0)
    assert len(rows) == 3 and len({prompts[r] for r in rows}) == 3
    assert distinct_prompt_rows(prompts, 2, seed=1) == sorted(distinct_prompt_rows(prompts, 2, seed=1))
    assert len(distinct_prompt_rows(prompts, 2, seed=1)) == 2


def test_passes_hold_at_most_micro_items_and_the_token_budget() -> None:
    assert passes([3, 3, 3, 3, 3], micro=2, tokens=100) == [[0, 1], [2, 3], [4]]
    assert passes([3, 3, 3, 3, 3], micro=64, tokens=7) == [[0, 1], [2, 3], [4]]
    assert passes([9, 1, 1, 9], micro=64, tokens=5) == [[0], [1, 2], [3]]  # longer than the budget: alone
    assert passes([], micro=4, tokens=4) == []


def test_a_logits_budget_splits_the_passes_and_leaves_the_matrix_as_it_was() -> None:
    """Over a large vocabulary a pass of `micro` sequences would hold gigabytes of logits
    (Gemma 3: 262,144 tokens; 64 sequences ran a 24 GB machine out of memory): the
    passes are cut to the budget, and every score is what one pass gives."""
    policy = Constructed("sharpened")
    calls: list[int] = []
    decode = policy.get_decoder()

    def counted(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        calls.append(input_ids.shape[0])
        return decode(input_ids, attention_mask)

    policy.get_decoder = lambda: counted  # type: ignore[method-assign]
    prompts = [(s, 6, 7, 6) for s in range(4)]
    responses = [(s, 6) for s in range(4)]  # 2 tokens each
    whole = cross_logprobs(policy, prompts, responses, [1.0] * 4, micro=64)
    assert calls == [16]
    calls.clear()
    budget = 5 * 4 * V  # 5 response tokens of float32 logits: two pairs a pass
    cut = cross_logprobs(policy, prompts, responses, [1.0] * 4, micro=64, logits_bytes=budget)
    assert calls == [2] * 8
    np.testing.assert_allclose(cut, whole, rtol=0, atol=1e-6)
