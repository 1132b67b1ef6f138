"""The agent loop and the `hf` engine with real tokenizers (Qwen2.5's and SmolLM2's,
`tests.fixtures.real_models`), where ``<answer>`` and ``</answer>`` are several tokens,
``>`` merges with what follows, the template writes its own system prompt and the
vocabulary has 49k-152k entries. The vLLM engine runs the same checks in
tests/stages/engines/test_vllm.py (through `make_engine` there)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import envs
from stages.agent import prompts
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec, run_episodes
from stages.engines import Completion, SamplingParams
from stages.engines.hf import HFEngine
from stages.models.policy import load_policy
from tests.fixtures.real_models import qwen25_tokenizer, scripted_model, smollm2_tokenizer, tiny_model

#: name -> (tokenizer, architecture, a token that merges `>` with what follows the tag)
REAL = {
    "qwen2.5": (qwen25_tokenizer, "qwen2", ">\n"),
    "smollm2": (smollm2_tokenizer, "llama", ">."),
}

EngineFactory = Callable[[Path], Any]


@pytest.fixture(scope="module")
def make_engine() -> EngineFactory:
    """How the tests below build an engine on a policy (test_vllm.py runs them with vLLM's)."""
    return HFEngine


def ids_of(tokenizer: Any, *pieces: str) -> list[int]:
    """Token ids of pieces that are one token each."""
    out = []
    for piece in pieces:
        ids = tokenizer.encode(piece, add_special_tokens=False)
        assert len(ids) == 1, f"{piece!r} is {len(ids)} tokens"
        out += ids
    return out


def play(engine: Any, cfg: AgentConfig, n: int = 3, env: str = "frozenlake", temperature: float = 1.0) -> tuple:
    """Episodes played to the end, and the completions each was given, in order."""
    chat = Chat(engine.tokenizer, cfg.think)
    eps = [Episode(envs.make(env), EpisodeSpec(env, "{}", 11 + i, i, 0), cfg, chat) for i in range(n)]
    given: dict[int, list[Completion]] = {id(e): [] for e in eps}
    calls = iter(range(1000))

    def respond(active: list[Episode]) -> list[Completion]:
        params = cfg.sampling(temperature)
        params = SamplingParams(**{**params.__dict__, "seed": next(calls)})
        out = engine.generate([e.prompt for e in active], params)
        for e, c in zip(active, out):
            given[id(e)].append(c)
        return out

    run_episodes(eps, respond)
    return eps, [given[id(e)] for e in eps]


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.fixture(scope="module", params=list(REAL))
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, str, Path]:
    make, arch, _ = REAL[request.param]
    tokenizer = make()
    policy = tiny_model(arch, tokenizer, tmp_path_factory.mktemp(request.param) / "policy")
    return request.param, tokenizer, arch, policy


def check_mask_is_exactly_the_sampled_tokens(engine: Any, tokenizer: Any) -> None:
    for think, history in ((False, None), (True, 0)):  # the whole chat, and a turn per sample
        cfg = AgentConfig(think=think, history=history, max_turns=3, max_new_tokens=10)
        eps, given = play(engine, cfg)
        for e, completions in zip(eps, given):
            sampled = [t for c in completions for t in c.token_ids]
            assert [t for t, m in zip(e.ids, e.mask) if m] == sampled
            runs = mask_runs(e.mask)
            assert [e.ids[a:b] for a, b in runs] == [c.token_ids for c in completions if c.token_ids]
            prefix = tokenizer.encode(prompts.generation_prefix(think), add_special_tokens=False)
            for a, _ in runs:  # every response follows the whole generation prefix, which is prompt
                assert e.ids[a - len(prefix) : a] == prefix and not any(e.mask[a - len(prefix) : a])


def test_the_loss_mask_covers_exactly_the_sampled_tokens(real, make_engine):
    _, tokenizer, _, policy = real
    check_mask_is_exactly_the_sampled_tokens(make_engine(policy), tokenizer)


def fresh_logprobs(model: Any, ids: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


def check_logprobs(engine: Any, policy: Path) -> None:
    model, _ = load_policy(policy)
    for think, temperature in ((False, 1.0), (True, 0.7)):
        cfg = AgentConfig(think=think, history=None, max_turns=2, max_new_tokens=8)
        eps, _ = play(engine, cfg, temperature=temperature)
        for e in eps:
            mask = torch.tensor(e.mask, dtype=torch.bool)
            assert mask.sum() > 0
            fresh = fresh_logprobs(model, e.ids, temperature)
            assert torch.allclose(fresh[mask], torch.tensor(e.logprobs)[mask], atol=1e-4)


def test_stored_logprobs_equal_a_plain_forward_pass(real, make_engine):
    _, _, _, policy = real
    check_logprobs(make_engine(policy), policy)


def answer_chain(tokenizer: Any, end: str, then: tuple[str, ...] = ()) -> list[int]:
    """The token chain of a response ``Left</answer>`` (thinking off) whose tag's last
    token is `end`: ``>`` alone, the generation prefix's last token (the chain then
    loops back), or ``>`` merged with what follows, followed by `then`. It starts from
    the prefix's last token, so every prompt sets it off. (A chain cannot hold a token
    twice, so thinking is checked by the random-weight tests above.)"""
    start = tokenizer.encode(prompts.generation_prefix(False), add_special_tokens=False)[-1:]
    assert tokenizer.convert_ids_to_tokens(start[0]) == ">"
    body = ids_of(tokenizer, "Left", "</", "answer")
    return start + body if end == ">" else start + body + ids_of(tokenizer, end, *then)


def scripted(tokenizer: Any, arch: str, chain: list[int], where: Path) -> Path:
    return scripted_model(arch, tokenizer, chain, where / "scripted")


@pytest.mark.parametrize("merged", [False, True], ids=["tag-ends-a-token", "tag-ends-inside-a-token"])
def test_stop_at_answer_stops_where_the_closing_tag_ends(real, merged, tmp_path, make_engine):
    name, tokenizer, arch, _ = real
    end = REAL[name][2] if merged else ">"
    engine = make_engine(scripted(tokenizer, arch, answer_chain(tokenizer, end, then=("More", " words")), tmp_path))
    cfg = AgentConfig(think=False, history=None, max_turns=2, max_new_tokens=30, stop_at_answer=True)
    eps, given = play(engine, cfg, n=2, env="sokoban")  # Left never ends a Sokoban episode
    for e, completions in zip(eps, given):
        for c in completions:
            text = tokenizer.decode(c.token_ids)
            assert c.finished and text == "Left</answer>" + end[1:], text
        assert [t["actions"] for t in e.turns] == [["Left"], ["Left"]] and all(t["format_ok"] for t in e.turns)
    off = AgentConfig(think=False, history=None, max_turns=1, max_new_tokens=30, stop_at_answer=False)
    _, given = play(engine, off, n=1)  # the same model runs on past its answer without the stop
    assert not given[0][0].finished and tokenizer.decode(given[0][0].token_ids).count("</answer>") > 1


def test_a_response_sampled_in_a_split_the_tokenizer_would_not_make_is_trained_as_sampled(real, tmp_path, make_engine):
    """``Le`` ``ft`` ``</`` ``ans`` ``wer`` ``>``: its text re-encodes to other tokens
    (``Left``, ``answer``); the trajectory keeps the sampled ones."""
    _, tokenizer, arch, _ = real
    start = tokenizer.encode(prompts.generation_prefix(False), add_special_tokens=False)[-1:]
    chain = start + ids_of(tokenizer, "Le", "ft", "</", "ans", "wer")  # then back to `>`
    engine = make_engine(scripted(tokenizer, arch, chain, tmp_path))
    cfg = AgentConfig(think=False, history=None, max_turns=2, max_new_tokens=12, stop_at_answer=True)
    eps, given = play(engine, cfg, n=1, env="sokoban")
    sampled = chain[1:] + start
    assert tokenizer.encode(tokenizer.decode(sampled), add_special_tokens=False) != sampled
    e = eps[0]
    assert [c.token_ids for c in given[0]] == [sampled, sampled]
    assert [e.ids[a:b] for a, b in mask_runs(e.mask)] == [sampled, sampled]
    assert [t["actions"] for t in e.turns] == [["Left"], ["Left"]]


def expected_chat(tokenizer: Any, eps: Episode, think: bool) -> str:
    """The whole chat as the tokenizer's own template writes it, with each turn's user
    message and response as played."""
    messages = [{"role": "system", "content": prompts.SYSTEM}]
    prefix = prompts.generation_prefix(think)
    eos = tokenizer.eos_token
    for i in range(len(eps.turns)):
        user = eps._intro + eps.blocks[0].text if i == 0 else eps.blocks[i].reward + eps.blocks[i].text
        response = tokenizer.decode(eps.blocks[i].response)
        messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": prefix + response.removesuffix(eos)},
        ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return text[: text.rindex(eos)] + (eos if eps.blocks[-1].response[-1:] == [tokenizer.eos_token_id] else "")


@pytest.mark.parametrize("stop", [True, False], ids=["cut-at-answer", "ended-by-end-of-turn"])
def test_the_chat_is_the_template_s_own_with_one_system_prompt(real, stop, tmp_path, make_engine):
    """Whole-chat history: the tokens decode to exactly what the template writes for the
    same messages (its default system prompt never added), whether a response was cut at
    its answer (the template closes the turn) or sampled the end-of-turn token."""
    name, tokenizer, arch, _ = real
    end = REAL[name][2]
    then = () if stop else (tokenizer.eos_token,)
    chain = answer_chain(tokenizer, end, then=then)
    engine = make_engine(scripted(tokenizer, arch, chain, tmp_path / "s"))
    cfg = AgentConfig(think=False, history=None, max_turns=3, max_new_tokens=30, stop_at_answer=stop)
    eps, _ = play(engine, cfg, n=2, env="sokoban")
    default_system = tokenizer.apply_chat_template([{"role": "user", "content": "u"}], tokenize=False)
    default_system = default_system.split("<|im_start|>user")[0]  # what the template writes without a system message
    assert "system" in default_system
    for e in eps:
        assert len(e.turns) == 3 and all(t["format_ok"] for t in e.turns)
        text = tokenizer.decode(e.ids)
        assert text == expected_chat(tokenizer, e, think=False)
        assert text.count(prompts.SYSTEM) == 1 and text.count("system\n") == 1
        assert default_system not in text
        for (a, b), block in zip(mask_runs(e.mask), e.blocks):
            assert e.ids[a:b] == block.response


def test_the_hf_engine_stops_at_the_tokenizer_s_end_of_turn_token(real):
    _, tokenizer, _, policy = real
    engine = HFEngine(policy)
    assert engine._stops(SamplingParams())[0] == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_the_hf_engine_builds_a_stop_string_s_table_once_not_at_every_call(real, tmp_path, monkeypatch):
    """A stop string of several tokens (``</answer>`` here) is matched by transformers'
    `StopStringCriteria`, a table over the whole vocabulary (1.7-2.0 CPU-s for
    Qwen2.5's). ``generate(stop_strings=...)`` built it on every call; the engine builds
    it once for the stop strings it is given, and still stops where they end; another
    engine on the same tokenizer (another policy version) uses the same table."""
    from transformers.generation import stopping_criteria

    from common import live

    live.close_ambient()  # nothing built before this test
    _, tokenizer, arch, _ = real
    built: list[tuple[str, ...]] = []
    original = stopping_criteria.StopStringCriteria.__init__

    def counted(self: Any, tokenizer: Any, stop_strings: Any) -> None:
        built.append(tuple(stop_strings))
        original(self, tokenizer, stop_strings)

    monkeypatch.setattr(stopping_criteria.StopStringCriteria, "__init__", counted)
    engine = HFEngine(scripted(tokenizer, arch, answer_chain(tokenizer, ">", then=()), tmp_path))
    cfg = AgentConfig(think=False, history=None, max_turns=3, max_new_tokens=30, stop_at_answer=True)
    _, given = play(engine, cfg, n=2, env="sokoban")
    assert [len(g) for g in given] == [3, 3]  # three calls
    assert all(c.finished and tokenizer.decode(c.token_ids) == "Left</answer>" for g in given for c in g)
    assert built == [("</answer>",)]
    other = HFEngine(scripted_model(arch, tokenizer, answer_chain(tokenizer, ">", then=()), tmp_path / "v1"))
    _, given = play(other, cfg, n=1, env="sokoban")
    assert all(c.finished for g in given for c in g) and built == [("</answer>",)]
