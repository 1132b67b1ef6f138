import json

import pytest
import torch

import envs
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec, run_episodes
from stages.engines import SamplingParams
from stages.engines.hf import HFEngine, shared_prefix
from stages.models.policy import load_policy, save_policy


def play(engine, n=4, turns=3, seed=0, temperature=1.0, history=None):
    cfg = AgentConfig(max_turns=turns, max_new_tokens=12, history=history)
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


@pytest.mark.parametrize("history", [None, 0, 1])
def test_prefix_cache_gives_the_same_samples(tiny_policy, history):
    """The whole chat (each turn extends the last) and a turn per prompt (every prompt
    starts with the shared instructions, whose cache is kept across calls)."""
    engine = HFEngine(tiny_policy)
    with_cache = [(e.ids, e.logprobs) for e in play(engine, history=history)]
    without = [(e.ids, e.logprobs) for e in play(HFEngine(tiny_policy, prefix_cache=False), history=history)]
    assert [ids for ids, _ in with_cache] == [ids for ids, _ in without]
    for (_, a), (_, b) in zip(with_cache, without, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
    if history is not None:  # the instructions were encoded once, and are kept
        assert engine._shared is not None and len(engine._shared[0]) >= 16


def test_the_shared_prefix_leaves_every_prompt_a_token():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5]]) == 3
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter prompt keeps its last token
    assert shared_prefix([[7, 2], [1, 2]]) == 0
    assert shared_prefix([[1, 2, 3]]) == 2


def test_a_new_policy_drops_the_kept_prefix(tiny_policy):
    engine = HFEngine(tiny_policy)
    play(engine, history=0)
    assert engine._shared is not None
    engine.load_weights(tiny_policy)
    assert engine._shared is None


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


def test_a_one_token_stop_string_ends_rows_by_token_id(tiny_policy):
    engine = HFEngine(tiny_policy)
    eos = engine.tokenizer.eos_token_id
    (close,) = engine.tokenizer.encode("</answer>", add_special_tokens=False)  # the markup is one token
    stops = engine._stops(SamplingParams(stop=("</answer>",)))
    assert stops == ([eos, close], [])
    cut = engine._trim([5, 9, close, 7, eos, eos], [-1.0, -2.0, -3.0, -4.0, -5.0, 0.0], stops)
    assert (cut.token_ids, cut.logprobs, cut.finished) == ([5, 9, close], [-1.0, -2.0, -3.0], True)
    assert engine._trim([5, eos, close], [-1.0, -2.0, -3.0], stops).token_ids == [5, eos]
    assert not engine._trim([5, 9], [-1.0, -2.0], stops).finished  # cut by the length limit
    # a stop string of several tokens is matched on the decoded text instead
    assert engine._stops(SamplingParams(stop=("Up</answer>",)))[1] == ["Up</answer>"]
    prompts = [engine.tokenizer.encode(f"Turn {k}:\nState:\n", add_special_tokens=False) for k in range(8)]
    for c in engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, stop=("</answer>",))):
        assert close not in c.token_ids[:-1] and eos not in c.token_ids[:-1]


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


def test_a_batch_samples_the_same_whatever_the_engine_played_before(tiny_policy):
    """A resumed run replays a batch in a fresh engine: the kept prefix must not change
    where the batch is split (here the second batch shares more than the first)."""
    engine, fresh = HFEngine(tiny_policy), HFEngine(tiny_policy)
    chat = Chat(engine.tokenizer, think=False)
    first = [chat.first("Goal: 1 Down."), chat.first("Goal: 2 Left, 1 Up.")]
    second = [chat.first("Goal: 3 Right, 2 Down.")] * 4
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    engine.generate(first, params)
    after = engine.generate(second, params)
    alone = fresh.generate(second, params)
    assert [c.token_ids for c in after] == [c.token_ids for c in alone]
    assert [c.logprobs for c in after] == [c.logprobs for c in alone]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_score_gives_the_logprobs_generate_stored_for_the_same_tokens(tiny_policy, temperature):
    """A forced answer's stored log-probs (`stages.agent.explore`) are what the policy would
    have stored had it sampled those tokens."""
    engine = HFEngine(tiny_policy)
    prompts = [e.prompt for e in play(engine, n=3, turns=1)]
    out = engine.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=6, seed=3))
    scored = engine.score(prompts, [c.token_ids for c in out], temperature)
    for c, s in zip(out, scored):
        assert len(s) == len(c.token_ids)
        assert s == pytest.approx(c.logprobs, abs=2e-4)


def test_a_checkpoints_own_sampling_settings_change_nothing(tiny_policy, tmp_path):
    """The adversary: a generation_config.json with a repetition penalty and a top-k, which
    transformers would apply by default. Samples must still come from softmax(logits / T),
    as the stored log-probs (and the update's recomputation) assume."""
    import shutil

    from transformers import GenerationConfig

    own = tmp_path / "own-settings"
    shutil.copytree(tiny_policy, own)
    GenerationConfig(do_sample=True, repetition_penalty=3.0, top_k=2, temperature=5.0).save_pretrained(own)
    assert_logprobs_reproduced(HFEngine(own), own, 0.7)
    plain = [e.ids for e in play(HFEngine(tiny_policy), temperature=0.7)]
    assert [e.ids for e in play(HFEngine(own), temperature=0.7)] == plain


def test_sampled_logprobs_keep_one_step_of_logits_not_every_step(tiny_policy, monkeypatch):
    """The engine no longer asks transformers for every step's logits (batch x steps x
    vocabulary, 10 GB at 128 x 128 over Qwen2.5's vocabulary): each step's log-softmax is
    kept only until the next step names the token drawn from it."""
    from stages.engines import hf

    engine = HFEngine(tiny_policy)
    seen: dict[str, object] = {}
    generate = engine.model.generate

    def spy(**kwargs):
        seen.update(kwargs)
        return generate(**kwargs)

    monkeypatch.setattr(engine.model, "generate", spy)
    live_steps: list[int] = []
    original = hf.Sampler.__call__

    def counting(self, input_ids, scores):
        out = original(self, input_ids, scores)
        live_steps.append(1 if self.prev is not None else 0)
        return out

    monkeypatch.setattr(hf.Sampler, "__call__", counting)
    (completion,) = engine.generate([[1, 2, 3]], SamplingParams(temperature=0.7, max_new_tokens=8, seed=1))
    assert not seen.get("output_logits") and not seen.get("output_scores")
    assert max(live_steps) == 1 and len(completion.logprobs) == len(completion.token_ids)
