"""Probes: questions about a state that the environment answers itself.

A fresh model that is to act from a state must first *read* it: where the player
is, what each move leads to, where the goal or the box is relative to the player.
The environments generate such (question, answer) pairs without limit and without
any model, from states reached by random and expert play; the `pretrain` stage
teaches them before the warm start (docs/method.md#pretraining). Answers never
name an action as the thing to do: the probes teach reading, not deciding.

`probes(env)` gives (task, question, answer) triples for the env's current state;
`reached_states(...)` plays to varied states. FrozenLake and Sokoban have probes;
`has_probes(name)` says whether an environment does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from envs import frozenlake as fl
from envs import sokoban_gen
from envs.base import TextEnv
from envs.frozenlake import FrozenLake
from envs.registry import make
from envs.sokoban import Sokoban

Probe = tuple[str, str, str]  # task, question, answer

#: tasks per environment, in a fixed order (the metric names: pretrain/<env>/<task>)
TASKS: dict[str, tuple[str, ...]] = {
    "frozenlake": ("neighbour", "position", "goal_offset"),
    "sokoban": ("neighbour", "position", "box_offset", "target_offset"),
}


def has_probes(name: str) -> bool:
    return name in TASKS


Cell = tuple[int, int]  # row, column


def _signed(n: int) -> str:
    return f"+{n}" if n > 0 else str(n)


def _reading(you: Cell, neighbours: dict[str, str], offsets: list[tuple[str, str, Cell]]) -> list[Probe]:
    """The probes of a grid world: what one step in each direction leads to, where you
    are, and (task, what, cell) offsets from you (or from the cell a question names)."""
    out = [("neighbour", f"What is one step {m} of you?", what) for m, what in neighbours.items()]
    out.append(("position", "Which row and column are you in?", f"row {you[0] + 1}, column {you[1] + 1}"))
    for task, question, (dr, dc) in offsets:
        out.append((task, question, f"{_signed(dr)} rows, {_signed(dc)} columns"))
    return out


def _lake(env: FrozenLake) -> list[Probe]:
    (r, c), (gr, gc) = env.pos, env.goal
    neighbours = {}
    for m in fl.MOVES:
        x = fl.move(env.pos, m, env.size)
        neighbours[m] = "edge" if x == env.pos else "hole" if x in env.holes else "goal" if x == env.goal else "ice"
    return _reading(
        env.pos, neighbours, [("goal_offset", "Where is the goal from you, in rows and columns?", (gr - r, gc - c))]
    )


def _sokoban(env: Sokoban) -> list[Probe]:
    w = env.width

    def cell(i: int) -> Cell:
        return i // w, i % w

    def kind(q: int) -> str:
        if q not in env.floor:
            return "wall"
        if q in env.boxes:
            return "box on target" if q in env.targets else "box"
        return "target" if q in env.targets else "floor"

    def apart(a: int, b: int) -> Cell:
        return cell(b)[0] - cell(a)[0], cell(b)[1] - cell(a)[1]

    p = env.player
    box = min(env.boxes, key=lambda b: sum(map(abs, apart(p, b))))
    target = min(env.targets, key=lambda t: sum(map(abs, apart(box, t))))
    neighbours = {m: kind(p + o) for m, o in zip(sokoban_gen.MOVES, sokoban_gen.offsets(w))}
    return _reading(
        cell(p),
        neighbours,
        [
            ("box_offset", "Where is the nearest box from you, in rows and columns?", apart(p, box)),
            (
                "target_offset",
                "Where is the target nearest that box from the box, in rows and columns?",
                apart(box, target),
            ),
        ],
    )


def probes(env: TextEnv) -> list[Probe]:
    """(task, question, answer) for the env's current state (it must not be done)."""
    if isinstance(env, FrozenLake):
        return _lake(env)
    if isinstance(env, Sokoban):
        return _sokoban(env)
    raise ValueError(f"environment '{env.name}' has no probes (only {', '.join(TASKS)})")


def reached_states(name: str, options: dict | None, seeds: list[int], max_steps: int = 4) -> Iterator[TextEnv]:
    """For each seed: the env after 0..`max_steps` moves, each move random or the
    expert's (half and half), stopping early at the end of an episode; the env is
    yielded only while not done (its state is then a state a policy acts in)."""
    from envs.policies import expert

    for seed in seeds:
        env = make(name, **(options or {}))
        env.reset(seed)
        rng = random.Random(f"probe:{seed}")
        best = expert(seed)
        for _ in range(rng.randint(0, max_steps)):
            action = best(env) if rng.random() < 0.5 else rng.choice(env.action_words)
            _, _, done, _ = env.step(action)
            if done:
                break
        if not env.done:
            yield env
