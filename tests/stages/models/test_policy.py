"""The embedded model's construction: its initial weights follow `init_std`."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from common.errors import SpecError
from pipelines.graph.load import load_spec
from stages.agent.corpus import embedded_model
from stages.models.policy import EmbeddedModel

SMALL = EmbeddedModel(hidden_size=64, heads=2, kv_heads=1, layers=1, intermediate_size=96)


def _matrix_std(model: torch.nn.Module) -> float:
    """Std over every 2-d weight (embeddings and projections) of the model."""
    return float(torch.cat([p.detach().flatten() for p in model.parameters() if p.dim() == 2]).std())


@pytest.mark.parametrize("std", [0.02, 0.05])
def test_initial_weights_follow_init_std(std: float) -> None:
    model, _ = embedded_model(replace(SMALL, init_std=std, tie_embeddings=False), seed=0)
    assert _matrix_std(model) == pytest.approx(std, rel=0.05)


def test_the_same_seed_builds_the_same_weights_and_another_std_other_ones() -> None:
    a, _ = embedded_model(replace(SMALL, init_std=0.05), seed=3)
    b, _ = embedded_model(replace(SMALL, init_std=0.05), seed=3)
    c, _ = embedded_model(SMALL, seed=3)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q), name
        if p.dim() == 2:
            assert not torch.equal(p, r), name


def test_a_spec_with_init_std_zero_fails_at_load_time() -> None:
    with pytest.raises(SpecError, match=r"model\.embedded\.init_std: expected a number > 0"):
        load_spec("starpo.yaml", ["model.embedded.init_std=0"])
