import pytest

import envs
from common.config import ConfigProblem
from stages.agent.chat import Chat
from stages.agent.explore import force_answers, forced_answer
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec, run_episodes
from stages.agent.prompts import parse_response
from stages.engines import Completion
from stages.rollout import RolloutConfig


class Engine:
    """Answers `Up` at log-prob -0.1 per token; scores any response at -2.0 per token."""

    def __init__(self, tokenizer):
        self.tokenizer, self.scored = tokenizer, []

    def generate(self, prompts):
        ids = self.tokenizer.encode("Up</answer>", add_special_tokens=False)
        return [Completion(list(ids), [-0.1] * len(ids), True) for _ in prompts]

    def score(self, prompts, responses, temperature):
        self.scored.append((len(prompts), temperature))
        return [[-2.0] * len(r) for r in responses]


def episodes(tokenizer, n=64, **agent):
    cfg = AgentConfig(think=False, history=0, max_turns=3, max_actions_per_turn=1, **agent)
    chat = Chat(tokenizer, cfg.think)
    opts = {"slippery": False, "render": "relative"}
    return [
        Episode(envs.make("frozenlake", **opts), EpisodeSpec("frozenlake", "{}", 5 + i // 8, i // 8, i % 8), cfg, chat)
        for i in range(n)
    ]


def play(tokenizer, epsilon, seed=0, **agent):
    engine, turn = Engine(tokenizer), 0

    def respond(active):
        nonlocal turn
        turn += 1
        return force_answers(engine, active, engine.generate([e.prompt for e in active]), epsilon, seed, turn, 0.9)

    return run_episodes(episodes(tokenizer, **agent), respond), engine


def test_a_forced_turn_answers_one_drawn_action_word_with_the_engines_scores(tokenizer):
    eps, engine = play(tokenizer, 0.3, stop_at_answer=True)
    forced = sampled = 0
    for e in eps:
        assert e.row()["explored_turns"] == e.explored
        spans, cur = [], []
        for m, lp in zip(e.mask, e.logprobs):
            if m:
                cur.append(lp)
            elif cur:
                spans, cur = [*spans, cur], []
        spans += [cur] if cur else []
        for k, turn in enumerate(e.turns, start=1):
            if k in e.explored:
                forced += 1
                assert set(spans[k - 1]) == {-2.0}  # the engine's scores, not the sampled response's
                assert turn["format_ok"] and len(turn["actions"]) == 1
                assert turn["actions"][0] in e.env.action_words
            else:
                sampled += 1
                assert set(spans[k - 1]) == {-0.1} and turn["actions"] == ["Up"]
    assert 0.2 < forced / (forced + sampled) < 0.4
    assert all(t == 0.9 for _, t in engine.scored)  # scored at the sampling temperature
    # the drawn words are spread over all of them, the policy's own included
    words = {t["actions"][0] for e in eps for k, t in enumerate(e.turns, 1) if k in e.explored}
    assert words == set(eps[0].env.action_words)


def test_the_forced_turns_are_a_function_of_the_seed_and_the_episode(tokenizer):
    first = [e.explored for e in play(tokenizer, 0.3)[0]]
    assert first == [e.explored for e in play(tokenizer, 0.3)[0]]
    assert first != [e.explored for e in play(tokenizer, 0.3, seed=1)[0]]


def test_without_epsilon_nothing_is_forced_or_scored(tokenizer):
    eps, engine = play(tokenizer, 0.0)
    assert not engine.scored and all(e.row()["explored_turns"] == [] for e in eps)


def test_a_forced_answer_ends_as_the_policys_would(tokenizer):
    cut, full = episodes(tokenizer, 1, stop_at_answer=True)[0], episodes(tokenizer, 1)[0]
    ids = forced_answer(cut, "Left", tokenizer)
    assert tokenizer.decode(ids) == "Left</answer>"
    assert parse_response(tokenizer.decode(ids), False, 1).actions == ("Left",)
    assert forced_answer(full, "Left", tokenizer) == [*ids, tokenizer.eos_token_id]


@pytest.mark.parametrize(
    ("fields", "says"),
    [({"engine": "vllm"}, "hf engine"), ({"env": "countdown"}, "free-form")],
)
def test_exploration_needs_an_engine_that_scores_and_action_words(fields, says):
    with pytest.raises(ConfigProblem, match=says) as info:
        RolloutConfig(explore=0.1, **fields)
    assert info.value.field == "explore"
    RolloutConfig(**fields)  # fine without it


def test_the_policys_own_trajectories_are_those_without_a_forced_turn():
    import pyarrow as pa

    from stages.agent.explore import read_explored, unexplored

    t = pa.table({"x": [0, 1, 2, 3], "explored_turns": pa.array([[], [2], None, [1, 3]], pa.list_(pa.int32()))})
    assert unexplored(t)["x"].to_pylist() == [0, 2]  # NULL: written before the column, nothing forced
    assert unexplored(t.drop_columns(["explored_turns"])).num_rows == 4

    class Old:
        """A table stored before the column: asking for it fails as Parquet does."""

        def read(self, columns):
            if "explored_turns" in columns:
                raise pa.ArrowInvalid("No match for FieldRef.Name(explored_turns)")
            return t.select(columns)

    assert read_explored(Old(), ["x"]).column_names == ["x"]
