"""Sokoban comparators for the `relative` view: text-only rules a trained policy must
beat, read from the observation text alone (`env.render()`), as `envs.lake_rules` does
for FrozenLake.

    ``open_moves``              a move not labelled ``wall`` nor ``a box that cannot move``, else random
    ``take_labelled_push``      a move labelled ``a box, pushed onto a target`` if there is one, else
                                an open move: it finishes a room whose box is one push from its target
    ``avoid_corners``           ``take_labelled_push``, whose fallback also leaves out moves labelled
                                ``a box, pushed into a corner`` (a box that never moves again)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from envs.base import TextEnv
from envs.sokoban import BLOCKED, CORNERED
from envs.sokoban_gen import MOVES

Policy = Callable[[TextEnv], str]

_LABEL = re.compile(r"\b(" + "|".join(MOVES) + r")\s*:\s*([^.]+)")


def _labels(text: str) -> dict[str, str]:
    """Move -> what the observation says it leads to (``Up: wall`` -> wall)."""
    return {m: what.strip().lower() for m, what in _LABEL.findall(text.splitlines()[-1] if text else "")}


def _open(seed: int, name: str, avoid: tuple[str, ...]) -> Policy:
    """A random move among those not labelled with one of `avoid`, else any move."""
    rng = random.Random(f"{name}:{seed}")

    def act(env: TextEnv) -> str:
        labels = _labels(env.render())
        return rng.choice([m for m in MOVES if labels.get(m) not in avoid] or list(MOVES))

    return act


def _push_else(fallback: Policy) -> Policy:
    """A move labelled as a push onto a target if there is one, else `fallback`."""

    def act(env: TextEnv) -> str:
        labels = _labels(env.render())
        pushes = [m for m in MOVES if labels.get(m) == "a box, pushed onto a target"]
        return pushes[0] if pushes else fallback(env)

    return act


def open_moves(seed: int) -> Policy:
    return _open(seed, "open_moves", BLOCKED)


def take_labelled_push(seed: int) -> Policy:
    return _push_else(open_moves(seed))


def avoid_corners(seed: int) -> Policy:
    return _push_else(_open(seed, "avoid_corners", (*BLOCKED, CORNERED)))


TEXT_RULES: dict[str, Callable[[int], Policy]] = {
    "open_moves": open_moves,
    "take_labelled_push": take_labelled_push,
    "avoid_corners": avoid_corners,
}
