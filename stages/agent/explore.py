"""Exploration by forced answers: `rollout.explore` (why and what it measured:
docs/method.md#exploration-where-the-policy-is-sure).

Each turn of a training episode, with probability eps, answers one uniformly drawn
action word instead of the sampled response; its ``logprobs`` are the sampling
policy's scores of those tokens (`Engine.score`), so it is trained as if sampled,
and its turn number goes to the trajectory's ``explored_turns``. `unexplored` gives
the trajectories that describe the policy's own sampling. The draws are a function
of the step's seed and each episode's spec and turn: a resumed rollout forces the
same turns.
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
