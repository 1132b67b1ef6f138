import json

import pytest
import torch

import envs
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec, run_episodes
from stages.engines import SamplingParams
from stages.engines.hf import HFEngine
from stages.models.policy import load_policy, save_policy


def play(engine, n=4, turns=3, seed=0, temperature=1.0):
    cfg = AgentConfig(max_turns=turns, max_new_tokens=12)
    chat = Chat(engine.tokenizer, cfg.think)
    eps = [
        Episode(envs.make("sokoban"), EpisodeSpec("sokoban", "{}", 7 + i // 2, i // 2, i % 2), cfg, chat)
        for i in range(n)
    ]
    calls = iter(range(100))
    run_episodes(
        eps,
        lambda a: engine.generate(
            [e.ids for e in a], SamplingParams(temperature=temperature, max_new_tokens=12, seed=seed + next(calls))
        ),
    )
    return eps


def fresh_logprobs(model, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


def assert_logprobs_reproduced(engine, policy, temperature):
    """The engine's stored log-probabilities equal a transformers forward pass of `policy`."""
    model, _ = load_policy(policy)
    for ep in play(engine, temperature=temperature):
        mask = torch.tensor(ep.mask, dtype=torch.bool)
        assert mask.sum() > 0
        fresh = fresh_logprobs(model, ep.ids, temperature)
        assert torch.allclose(fresh[mask], torch.tensor(ep.logprobs)[mask], atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stored_logprobs_match_a_fresh_forward_pass(tiny_policy, temperature):
    assert_logprobs_reproduced(HFEngine(tiny_policy), tiny_policy, temperature)


def test_prefix_cache_gives_the_same_samples(tiny_policy):
    with_cache = [e.ids for e in play(HFEngine(tiny_policy))]
    without = [e.ids for e in play(HFEngine(tiny_policy, prefix_cache=False))]
    assert with_cache == without


def test_seeded_sampling_is_deterministic(tiny_policy):
    engine = HFEngine(tiny_policy)
    assert [e.ids for e in play(engine, seed=1)] == [e.ids for e in play(engine, seed=1)]
    assert [e.ids for e in play(engine, seed=1)] != [e.ids for e in play(engine, seed=2)]


def test_greedy_and_stop_strings(tiny_policy):
    engine = HFEngine(tiny_policy)
    prompt = engine.tokenizer.encode("Turn 1:\nState:\n", add_special_tokens=False)
    a, b = (engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=8, seed=s))[0] for s in (1, 2))
    assert a.token_ids == b.token_ids and len(a.token_ids) <= 8
    stop = engine.tokenizer.decode(a.token_ids[2:4]) if len(a.token_ids) >= 4 else ""
    if stop.strip():
        cut = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=8, stop=(stop,)))[0]
        assert cut.finished and stop in engine.tokenizer.decode(cut.token_ids)
        assert len(cut.token_ids) <= len(a.token_ids)


def test_load_weights_changes_the_samples(tiny_policy, tmp_path):
    engine = HFEngine(tiny_policy)
    before = [e.ids for e in play(engine)]
    model, tok = load_policy(tiny_policy)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    save_policy(model, tok, tmp_path / "p1", version=1)
    engine.load_weights(tmp_path / "p1")
    after = play(engine)
    assert [e.ids for e in after] != before
    fresh = fresh_logprobs(model, after[0].ids)
    mask = torch.tensor(after[0].mask, dtype=torch.bool)
    assert torch.allclose(fresh[mask], torch.tensor(after[0].logprobs)[mask], atol=1e-4)
    assert json.loads((tmp_path / "p1" / "policy.json").read_text())["version"] == 1


def test_sampling_leaves_the_process_rng_alone(tiny_policy):
    engine = HFEngine(tiny_policy)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    play(engine, seed=5)
    assert torch.equal(torch.rand(3), expected)
