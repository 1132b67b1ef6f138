"""bench/train_step.py's prompt lever: the same tokens in another order, the constant line shared."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.train_step import CONSTANT_LINE, constant_first
from stages.agent.corpus import embedded_tokenizer
from stages.agent.loop import AgentConfig
from stages.models.forward import shared_length
from stages.training.pretrain import probe_samples
from stages.training.sft import sft_batch


def test_the_constant_line_moves_into_the_shared_prefix_and_nothing_else_changes():
    tokenizer = embedded_tokenizer(1024)
    agent = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    seeds = list(range(5 * 10**12, 5 * 10**12 + 12))
    samples = [
        s for _, s in probe_samples("frozenlake", {"slippery": False, "render": "grid"}, seeds, tokenizer, agent)
    ]
    moved = constant_first(samples, tokenizer)
    line = len(tokenizer(CONSTANT_LINE, add_special_tokens=False)["input_ids"])
    for a, b in zip(samples, moved, strict=True):
        assert Counter(a.ids) == Counter(b.ids) and a.ids != b.ids
        answer = [t for t, lab in zip(a.ids, a.labels) if lab != -100]
        assert [t for t, lab in zip(b.ids, b.labels) if lab != -100] == answer
        assert a.ids[-len(answer) :] == b.ids[-len(answer) :]
    before = shared_length(*sft_batch(samples[:8], tokenizer.pad_token_id)[:2])
    after = shared_length(*sft_batch(moved[:8], tokenizer.pad_token_id)[:2])
    assert after == before + line
    with pytest.raises(SystemExit, match="the default's prompt changed"):
        constant_first(moved, tokenizer)
