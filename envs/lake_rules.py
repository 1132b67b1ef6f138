"""FrozenLake comparators: the shortcuts a policy could learn instead of the task.

A trained policy's success means little until it stands beside the simplest rules
that score as well. Three kinds are here:

- **text-only rules**, which read nothing but the observation text the policy reads
  (`env.render()`), the way a lookup table over strings would:
    ``copy_goal_word``       an action word that appears on the ``Goal:`` line, else random
    ``avoid_labelled_holes`` a move whose label is not ``hole`` (nor ``edge``), else random
    ``copy_goal_word_safe``  both: a goal-line word not labelled ``hole``, else a non-hole move
    ``take_labelled_goal``   the move labelled ``goal`` if there is one, else a non-hole move
- ``greedy_safe``, which reads the state (where the player, goal and holes are): a move
  that shortens the distance to the goal without entering a hole, else any move that
  does not enter a hole, else random. It is what "reading the map" buys without planning.
- ``toward_goal``, the same without the holes: a move that shortens the distance to the
  goal, else one that does not hit the edge, else random. A policy that learned only to
  follow the goal's offset scores about this; the gap up to ``greedy_safe`` is reading
  the hole labels.
- the exact success of the uniform random policy (`random_success`), by dynamic
  programming over the lake's transitions: no sampling noise.

Each rule is a `Policy` (``env -> action word``) like those of `envs.policies`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from functools import cache

from envs.base import TextEnv
from envs.frozenlake import MOVES, FrozenLake, move

Policy = Callable[[TextEnv], str]

_LABEL = re.compile(r"\b(" + "|".join(MOVES) + r")\s*:\s*(\w+)")


def _goal_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.lower().startswith("goal")), "")


def _goal_words(text: str) -> list[str]:
    line = _goal_line(text)
    return [m for m in MOVES if re.search(rf"\b{m}\b", line)]


def _labels(text: str) -> dict[str, str]:
    """Move -> the word the observation puts after it (``Left: hole`` -> hole), on
    every line but the goal's."""
    rest = "\n".join(line for line in text.splitlines() if not line.lower().startswith("goal"))
    return {m: what.lower() for m, what in _LABEL.findall(rest)}


def _safe(text: str) -> list[str]:
    labels = _labels(text)
    return [m for m in MOVES if labels.get(m) not in ("hole", "edge")]


def copy_goal_word(seed: int) -> Policy:
    rng = random.Random(f"copy_goal_word:{seed}")

    def act(env: TextEnv) -> str:
        return rng.choice(_goal_words(env.render()) or list(MOVES))

    return act


def avoid_labelled_holes(seed: int) -> Policy:
    rng = random.Random(f"avoid_labelled_holes:{seed}")

    def act(env: TextEnv) -> str:
        return rng.choice(_safe(env.render()) or list(MOVES))

    return act


def copy_goal_word_safe(seed: int) -> Policy:
    rng = random.Random(f"copy_goal_word_safe:{seed}")

    def act(env: TextEnv) -> str:
        text = env.render()
        safe = _safe(text)
        return rng.choice([m for m in _goal_words(text) if m in safe] or safe or list(MOVES))

    return act


def take_labelled_goal(seed: int) -> Policy:
    rng = random.Random(f"take_labelled_goal:{seed}")

    def act(env: TextEnv) -> str:
        text = env.render()
        goal = [m for m, what in _labels(text).items() if what == "goal"]
        return rng.choice(goal or _safe(text) or list(MOVES))

    return act


def _closer(env: FrozenLake, moves: list[str]) -> list[str]:
    """The moves of `moves` that shorten the (Manhattan) distance to the goal."""
    (gr, gc) = env.goal

    def distance(p: tuple[int, int]) -> int:
        return abs(p[0] - gr) + abs(p[1] - gc)

    return [a for a in moves if distance(move(env.pos, a, env.size)) < distance(env.pos)]


def greedy_safe(seed: int) -> Policy:
    rng = random.Random(f"greedy_safe:{seed}")

    def act(env: TextEnv) -> str:
        assert isinstance(env, FrozenLake)
        safe = env.safe_moves()
        return rng.choice(_closer(env, safe) or safe or list(MOVES))

    return act


def toward_goal(seed: int) -> Policy:
    rng = random.Random(f"toward_goal:{seed}")

    def act(env: TextEnv) -> str:
        assert isinstance(env, FrozenLake)
        moves = [a for a in MOVES if move(env.pos, a, env.size) != env.pos]
        return rng.choice(_closer(env, moves) or moves or list(MOVES))

    return act


#: the text-only rules (they read only what the policy reads)
TEXT_RULES: dict[str, Callable[[int], Policy]] = {
    "copy_goal_word": copy_goal_word,
    "avoid_labelled_holes": avoid_labelled_holes,
    "copy_goal_word_safe": copy_goal_word_safe,
    "take_labelled_goal": take_labelled_goal,
}
#: every comparator policy, text-only rules first
RULES: dict[str, Callable[[int], Policy]] = {**TEXT_RULES, "toward_goal": toward_goal, "greedy_safe": greedy_safe}


def random_success(env: FrozenLake, max_actions: int) -> float:
    """The exact probability that uniform random actions reach the goal within
    `max_actions` from the lake's start (env must be reset)."""
    holes, goal = env.holes, env.goal

    @cache
    def p(pos: tuple[int, int], left: int) -> float:
        if pos == goal:
            return 1.0
        if pos in holes or left == 0:
            return 0.0
        return sum(q * p(nxt, left - 1) for a in MOVES for q, nxt in env.transitions(pos, a)) / len(MOVES)

    return p(env.start, max_actions)
