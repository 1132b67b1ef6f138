import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec, run_episodes
from stages.engines import Completion


def scripted(tokenizer, texts):
    """A respond() that answers each turn with the next text (ending with <|im_end|>)."""
    it = iter(texts)

    def respond(active):
        text = next(it)
        ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        return [Completion(list(ids), [-0.5] * len(ids), True) for _ in active]

    return respond


def episode(tokenizer, env="sokoban", seed=3, **agent):
    cfg = AgentConfig(**agent)
    return Episode(envs.make(env), EpisodeSpec(env, "{}", seed, 0, 0), cfg, Chat(tokenizer, cfg.think))


def segments(ep):
    """Runs of loss-mask 1 in the token sequence."""
    out, cur = [], []
    for t, m in zip(ep.ids, ep.mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def test_masked_tokens_decode_to_exactly_the_responses(tokenizer):
    texts = [" a </think> <answer>Up || Left</answer>", " b </think> <answer>Down</answer>", " junk", " c"]
    ep = run_episodes([episode(tokenizer, max_turns=4)], scripted(tokenizer, texts))[0]
    segs = segments(ep)
    assert len(segs) == len(ep.turns) == 4
    for seg, turn in zip(segs, ep.turns):
        assert seg[-1] == tokenizer.eos_token_id  # the sampled end-of-turn token is trained on
        assert tokenizer.decode(seg, skip_special_tokens=True) == turn["response"]
    assert [lp for lp, m in zip(ep.logprobs, ep.mask) if m] == [-0.5] * sum(ep.mask)
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask) if not m)


def test_a_response_cut_at_its_answer_keeps_the_end_of_turn_token_the_template_writes(tokenizer):
    """With `stop_at_answer` the engine returns `... </answer>` (finished, no end-of-turn token
    sampled): the whole-chat history still closes the turn with the template's end-of-turn
    token, outside the loss mask, and the masked tokens are exactly the sampled ones."""

    def cut(texts):
        it = iter(texts)

        def respond(active):
            ids = tokenizer.encode(next(it), add_special_tokens=False)
            return [Completion(list(ids), [-0.5] * len(ids), True) for _ in active]

        return respond

    cfg = {"max_turns": 2, "stop_at_answer": True}
    assert AgentConfig(**cfg).stop() == ("</answer>",) and AgentConfig().stop() == ()
    ep = run_episodes(
        [episode(tokenizer, **cfg)], cut([" x </think> <answer>Up</answer>", " y </think> <answer>Up</answer>"])
    )[0]
    first, second = segments(ep)
    assert tokenizer.decode(first) == " x </think> <answer>Up</answer>" and tokenizer.eos_token_id not in first
    assert tokenizer.decode(second) == " y </think> <answer>Up</answer>"
    end = ep.ids.index(first[-1], ep.mask.index(1)) + 1
    assert ep.ids[end] == tokenizer.eos_token_id and ep.mask[end] == 0  # written by the template
    # the same chat as responses that sampled their end-of-turn token, less the last one (never sampled)
    whole = run_episodes(
        [episode(tokenizer, max_turns=2)], scripted(tokenizer, [" x </think> <answer>Up</answer>"] * 2)
    )
    assert tokenizer.decode(ep.ids).replace(" y ", " x ") + "<|im_end|>" == tokenizer.decode(whole[0].ids)


def test_prompt_follows_the_spec_layout(tokenizer):
    ep = episode(tokenizer, max_turns=2)
    text = tokenizer.decode(ep.ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n<think>")
    assert "Turn 1:\nState:\n" in text and "You have 10 actions left." in text and '"||"' in text
    run_episodes([ep], scripted(tokenizer, [" x </think> <answer>Up</answer>", " y"]))
    text = tokenizer.decode(ep.ids)
    assert "<|im_start|>user\nReward:\n" in text and "Turn 2:" in text


def test_action_budget_and_turn_accounting(tokenizer):
    five = " m </think> <answer>Up || Up || Up || Up || Up</answer>"
    ep = run_episodes([episode(tokenizer, "sokoban", seed=11)], scripted(tokenizer, [five] * 5))[0]
    assert ep.actions_taken <= 10 and ep.row()["num_actions"] == ep.actions_taken
    assert sum(t["executed"] for t in ep.turns) == ep.actions_taken
    assert ep.end in ("actions", "success", "done")
    if ep.end == "actions":
        assert ep.actions_taken == 10 and len(ep.turns) == 2
    ep = run_episodes(
        [episode(tokenizer, max_turns=2, max_actions_per_traj=3, max_actions_per_turn=2)],
        scripted(tokenizer, [five] * 2),
    )[0]
    assert next(len(t["actions"]) for t in ep.turns) == 2  # cut to max_actions_per_turn
    assert ep.actions_taken <= 3 and len(ep.turns) <= 2


def test_format_penalty_and_rewards(tokenizer):
    ep = run_episodes([episode(tokenizer, "bandit", seed=1)], scripted(tokenizer, [" no tags at all"]))[0]
    assert ep.turns[0]["reward"] == -0.1 and not ep.turns[0]["format_ok"] and ep.end == "turns"
    ep = run_episodes(
        [episode(tokenizer, "bandit", seed=1)], scripted(tokenizer, [" x </think> <answer>Phoenix</answer>"])
    )[0]
    assert ep.turns[0]["reward"] == 0.1 and ep.turns[0]["format_ok"] and ep.end == "done"
    mixed = " x </think> <answer>Up || Jump</answer>"
    ep = run_episodes([episode(tokenizer, "sokoban", seed=5, max_turns=1)], scripted(tokenizer, [mixed]))[0]
    turn = ep.turns[0]
    assert turn["valid"] == [True, False] and turn["executed"] == 1 and not turn["format_ok"]
    assert turn["reward"] == ep.row()["score"]
    env = envs.make("sokoban")
    env.reset(5)
    _, up_reward, _, _ = env.step("Up")
    assert abs(turn["reward"] - (up_reward - 0.1)) < 1e-9


def test_a_reasoning_bonus_is_paid_for_a_right_thought_the_answer_follows(tokenizer):
    def play(text, **agent):
        cfg = AgentConfig(**agent)
        env = envs.make("bandit", payoffs=True)
        ep = Episode(env, EpisodeSpec("bandit", '{"payoffs": true}', 1, 0, 0), cfg, Chat(tokenizer, cfg.think))
        return run_episodes([ep], scripted(tokenizer, [text]))[0].turns[0]

    right = " Dragon pays 1 x 0.25 = 0.25 on average. Phoenix pays 0.1 on average. </think> <answer>{}</answer>"
    assert play(right.format("Phoenix"), reasoning_bonus=0.5)["reward"] == 0.1  # right, not followed
    followed = play(right.format("Dragon"), reasoning_bonus=0.5)
    without = play(right.format("Dragon"))
    assert followed["reward"] - without["reward"] == 0.5 and without["reward"] in (0.0, 1.0)
    assert play(right.format("Dragon Phoenix"), reasoning_bonus=0.5)["reward"] < 0  # not the format: no bonus


def test_context_limit_ends_the_episode_cleanly(tokenizer):
    first = len(episode(tokenizer).ids)
    ep = episode(tokenizer, max_context=first + 60, max_new_tokens=20)
    run_episodes([ep], scripted(tokenizer, [" a </think> <answer>Left</answer>"] * 5))
    row = ep.row()
    assert row["truncated_context"] and row["end_reason"] == "context" and len(ep.ids) <= first + 60
    assert row["num_turns"] == 1
    ep = episode(tokenizer, max_context=32)  # the first prompt alone does not fit
    assert ep.done and ep.row()["num_turns"] == 0 and ep.row()["format_valid_rate"] == 0.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**31), st.sampled_from(["sokoban", "frozenlake", "countdown", "bandit"]))
def test_random_token_responses_never_crash(tokenizer, seed, env):
    rng = random.Random(seed)
    vocab = len(tokenizer)

    def respond(active):
        out = []
        for _ in active:
            ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 24))]
            out.append(Completion(ids, [0.0] * len(ids), rng.random() < 0.5))
        return out

    eps = run_episodes([episode(tokenizer, env, seed=seed % 1000) for _ in range(3)], respond)
    for ep in eps:
        row = ep.row()
        assert len(row["token_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
        assert 1 <= row["num_turns"] <= 5 and row["end_reason"]
