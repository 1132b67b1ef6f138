"""Exploration by forced answers (`rollout.explore`, docs/method.md#exploration-where-the-policy-is-sure).

A sure policy samples the same move from a state every time, so a group whose way
to the goal runs into a hole fails 8 times of 8 and carries no advantage: the
policy can never learn the move it does not try. With ``explore: eps`` each turn
of a training episode, with probability eps, answers one action word drawn
uniformly from the environment's, in the answer format, instead of the sampled
response. The turn is then played and trained like any other, with one
difference the catalog keeps: its turn number is in the trajectory's
``explored_turns``.

Its ``logprobs`` are the sampling policy's log-probs of the forced tokens
(`Engine.score`), so the update's ratio starts at 1 and the turn is trained as if
the policy had sampled it: an explored move that ends better than the policy's
own moves from the same state (GiGPO's step groups compare them) gets the
advantage at full strength. That is the ε-greedy trade: the gradient leans toward
the explored moves (it is not the gradient of the policy's own return), in
exchange for a signal where the policy had none.

What describes the policy's own sampling (the ``collapse/`` indicators, the
`mutual_info` diagnostic) reads only the trajectories without a forced turn
(`unexplored`): a drawn answer depends on no state and repeats four words.

The draws are a function of the step's seed and each episode's spec and turn, so
a resumed rollout forces the same turns.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.datasets import TableRef
from stages.agent import prompts
from stages.agent.loop import Episode
from stages.engines import Completion


def _rng(seed: int, episode: Episode, turn: int) -> random.Random:
    s = episode.spec
    text = f"explore:{seed}:{s.split}:{s.seed}:{s.group}:{s.sample}:{turn}"
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))


def forced_answer(episode: Episode, word: str, tokenizer: Any) -> list[int]:
    """The token ids of an answer holding only `word`, as the policy would write it: the
    answer format, ended at ``</answer>`` with `agent.stop_at_answer`, else with the
    end-of-turn token."""
    text = prompts.render_response([word], episode.cfg.think)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids if episode.cfg.stop_at_answer else [*ids, tokenizer.eos_token_id]


def force_answers(
    engine: Any,
    active: list[Episode],
    sampled: list[Completion],
    epsilon: float,
    seed: int,
    turn: int,
    temperature: float,
) -> list[Completion]:
    """`sampled` with each episode's response replaced, with probability `epsilon`, by
    the answer of a uniformly drawn action word, scored by the engine."""
    chosen: dict[int, list[int]] = {}
    for i, episode in enumerate(active):
        rng = _rng(seed, episode, turn)
        words = episode.env.action_words
        if words and rng.random() < epsilon:
            chosen[i] = forced_answer(episode, rng.choice(words), engine.tokenizer)
    if not chosen:
        return sampled
    rows = sorted(chosen)
    scores = engine.score([active[i].prompt for i in rows], [chosen[i] for i in rows], temperature)
    out = list(sampled)
    for i, logprobs in zip(rows, scores, strict=True):
        out[i] = Completion(chosen[i], list(logprobs), True, forced=True)
    return out


def unexplored(table: pa.Table) -> pa.Table:
    """The rows of a trajectory table with no forced turn (all of them without the column)."""
    if "explored_turns" not in table.column_names:
        return table
    return table.filter(pc.fill_null(pc.equal(pc.list_value_length(table["explored_turns"]), 0), True))


def read_explored(ref: TableRef, columns: list[str]) -> pa.Table:
    """`columns` of a stored trajectory table and its ``explored_turns`` (left out of a
    table written before the column: offline replay of an older catalog)."""
    try:
        return ref.read([*columns, "explored_turns"])
    except pa.ArrowInvalid:
        return ref.read(columns)
