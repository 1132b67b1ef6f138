"""Scripted policies: `random_valid` (uniform over valid actions), `random_safe` (the
same, on FrozenLake and Sokoban only over the moves that ruin nothing) and `expert`
(the shortest Sokoban plan by BFS, value iteration on slippery FrozenLake, the
high-risk Bandit arm, a Countdown solver, value iteration over a Gymnasium
environment's transition table, a TextWorld game's walkthrough). They make warm-start demonstrations and
serve as baselines; they may read the environment's internal state."""

from __future__ import annotations

import random
from collections.abc import Callable

from envs import countdown as cd
from envs import sokoban_gen
from envs.bandit import Bandit
from envs.base import EnvError, OneAnswer, TextEnv
from envs.countdown import Countdown
from envs.frozenlake import MOVES as LAKE_MOVES
from envs.frozenlake import FrozenLake
from envs.gym_text import GymText
from envs.sokoban import Sokoban
from envs.textworld_games import TextWorldGame

Policy = Callable[[TextEnv], str]


def random_valid(seed: int) -> Policy:
    rng = random.Random(f"random_valid:{seed}")  # independent of the env's own Random(seed)

    def act(env: TextEnv) -> str:
        if isinstance(env, Countdown):
            return cd.random_expression(rng, list(env.numbers))
        if isinstance(env, OneAnswer):
            answer = env.other_answer(rng)
            if answer is None:
                raise EnvError(
                    f"no random answer for environment '{env.name}' (its questions have no reference answers)"
                )
            return answer
        return rng.choice(env.action_words)

    return act


def random_safe(seed: int) -> Policy:
    """A safe random walker, ignoring the goal: uniform over `safe_moves()`, on FrozenLake
    the moves that neither enter a hole nor hit the edge, on Sokoban those that neither
    bump (a wall, a box that cannot move) nor push a box into a corner off its target (what
    the `relative` views label); `random_valid` elsewhere. As a warm start's demonstrator
    it teaches a fresh model to read the labels but leaves the goal for StarPO."""
    rng = random.Random(f"random_safe:{seed}")
    fallback = random_valid(seed)

    def act(env: TextEnv) -> str:
        if not isinstance(env, FrozenLake | Sokoban):
            return fallback(env)
        return rng.choice(env.safe_moves() or list(env.action_words))

    return act


def _sokoban_expert() -> Policy:
    plan: list[str] = []
    expected: object = None

    def act(env: TextEnv) -> str:
        nonlocal plan, expected
        assert isinstance(env, Sokoban)
        if env.state != expected or not plan:
            plan = sokoban_gen.solve(env.floor, env.targets, env.state, env.width) or ["Up"]
        move = plan.pop(0)
        _, boxes = env.state
        o = sokoban_gen.offsets(env.width)[sokoban_gen.MOVES.index(move)]
        q = env.player + o
        nb = tuple(sorted(q + o if b == q else b for b in boxes)) if q in boxes else boxes
        expected = (q, nb)
        return move

    return act


def lake_values(env: FrozenLake, gamma: float = 0.999, tol: float = 1e-9) -> dict[tuple[int, int], float]:
    """Success-probability values of the lake's cells by value iteration (a slight
    discount breaks ties towards shorter paths)."""
    cells = [(r, c) for r in range(env.size) for c in range(env.size) if (r, c) != env.goal and (r, c) not in env.holes]
    moves = {x: [env.transitions(x, a) for a in LAKE_MOVES] for x in cells}
    v = {(r, c): 0.0 for r in range(env.size) for c in range(env.size)}
    v[env.goal] = 1.0
    delta = 1.0
    while delta > tol:
        delta = 0.0
        for x in cells:
            new = gamma * max(sum(p * v[y] for p, y in outcomes) for outcomes in moves[x])
            delta, v[x] = max(delta, abs(new - v[x])), new
    return v


def _lake_expert() -> Policy:
    cache: dict[object, dict[tuple[int, int], float]] = {}

    def act(env: TextEnv) -> str:
        assert isinstance(env, FrozenLake)
        key = (env.holes, env.goal)
        if key not in cache:
            cache.clear()
            cache[key] = lake_values(env)  # once per map
        v = cache[key]
        return max(LAKE_MOVES, key=lambda a: sum(p * v[y] for p, y in env.transitions(env.pos, a)))

    return act


def expert(seed: int) -> Policy:
    """The best scripted policy for whichever environment it is given."""
    per_env: dict[type, Policy] = {Sokoban: _sokoban_expert(), FrozenLake: _lake_expert()}

    def act(env: TextEnv) -> str:
        if isinstance(env, Bandit):
            return env.best
        if isinstance(env, Countdown):
            return cd.solve(env.numbers, env.target) or cd.random_expression(random.Random(seed), list(env.numbers))
        for kind, policy in per_env.items():
            if isinstance(env, kind):
                return policy(env)
        if isinstance(env, GymText):
            return env.optimal_action()
        if isinstance(env, TextWorldGame):
            return env.walkthrough_action()
        if isinstance(env, OneAnswer) and (answer := env.reference()) is not None:
            return answer
        raise EnvError(f"no expert policy for environment '{env.name}'")

    return act


POLICIES: dict[str, Callable[[int], Policy]] = {
    "random_valid": random_valid,
    "random_safe": random_safe,
    "expert": expert,
}


def make_policy(name: str, seed: int = 0) -> Policy:
    if name not in POLICIES:
        raise EnvError(f"unknown scripted policy '{name}' (expected one of: {', '.join(POLICIES)})")
    return POLICIES[name](seed)


def play(
    env: TextEnv, policy: Policy, seed: int, max_actions: int | None = None, split: str | None = None
) -> tuple[bool, float, int]:
    """One episode within the reference budget: (success, total reward, actions taken);
    `split` as in `TextEnv.reset`."""
    env.reset(seed, split)
    limit = max_actions or env.budget.max_actions_per_traj
    total, steps = 0.0, 0
    while steps < limit:
        _, reward, done, info = env.step(policy(env))
        total, steps = total + reward, steps + 1
        if done:
            return info["success"], total, steps
    return False, total, steps
