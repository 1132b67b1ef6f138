"""Gymnasium environments with a text rendering, as text environments: ``gym:<id>``.

    env = envs.make("gym:FrozenLake-v1", is_slippery=False)   # options go to gymnasium.make

The state is the environment's ANSI rendering made plain: a character drawn on a
coloured background (where you are) becomes ``[c]``, a character in blue ``{c}``,
in magenta ``<c>``, in any other colour ``(c)``; each known environment's legend says
what those mean. Action words name the discrete actions (``Left`` for FrozenLake's
0, ``Pickup`` for Taxi's 4, ...); an environment without such names takes
``a0`` … ``aN``. The reward is the environment's; `success` is reaching the goal
(FrozenLake: the goal's reward; Taxi: the passenger delivered; CliffWalking: the
target), and the episode also ends when Gymnasium truncates it.

The toy-text environments publish their transition table (``P``), so the expert
policy (`envs.policies`) is optimal: value iteration over it (`optimal_action`).
Needs the ``gymnasium`` package (``pip install -e '.[envs]'``).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

from envs.base import Budget, EnvError, TextEnv

PREFIX = "gym:"


@dataclass(frozen=True)
class Known:
    """What the adapter knows of one Gymnasium environment family."""

    words: tuple[str, ...]
    legend: str
    task: str
    budget: Budget
    success_needs_reward: bool  # success = terminated with a positive reward (else: terminated)


KNOWN: dict[str, Known] = {
    "FrozenLake": Known(
        ("Left", "Down", "Right", "Up"),
        "S start, F frozen ice, H hole, G goal; [ ] marks your position.",
        "Walk from the start to the goal without falling into a hole.",
        Budget(max_turns=5, max_actions_per_traj=10, max_actions_per_turn=5),
        True,
    ),
    "Taxi": Known(
        ("South", "North", "East", "West", "Pickup", "Dropoff"),
        "[ ] is the taxi; {X} is where the passenger waits (none shown: the passenger is in the taxi); "
        "<X> is the destination; | is a wall, : is open road.",
        "Drive to the passenger, pick them up, drive to the destination and drop them off.",
        Budget(max_turns=10, max_actions_per_traj=20, max_actions_per_turn=4),
        False,
    ),
    "CliffWalking": Known(
        ("Up", "Right", "Down", "Left"),
        "x is you, o is safe ground, C is the cliff (stepping on it sends you back to the start), T is the target.",
        "Walk to the target without stepping on the cliff.",
        Budget(max_turns=8, max_actions_per_traj=20, max_actions_per_turn=4),
        False,
    ),
}
#: the ids `envs.names()` lists (any Gymnasium id with an ANSI rendering works)
LISTED = ("FrozenLake-v1", "Taxi-v4", "CliffWalking-v1")

_SGR = re.compile(r"\x1b\[([0-9;]*)m")


def plain(ansi: str) -> str:
    """An ANSI rendering as plain text: ``[c]`` for a coloured background, ``{c}`` for
    blue, ``<c>`` for magenta, ``(c)`` for another colour (see the module docstring)."""
    out: list[str] = []
    codes: set[int] = set()
    pos = 0
    for match in [*_SGR.finditer(ansi), None]:
        end = match.start() if match else len(ansi)
        text = ansi[pos:end]
        if text:
            if any(40 <= c <= 47 for c in codes):
                out.append(f"[{text}]")
            elif 34 in codes:
                out.append("{" + text + "}")
            elif 35 in codes:
                out.append(f"<{text}>")
            elif any(30 <= c <= 37 for c in codes):
                out.append(f"({text})")
            else:
                out.append(text)
        if match is None:
            break
        numbers = [int(c) for c in match.group(1).split(";") if c]
        codes = set() if not numbers or 0 in numbers else codes | set(numbers)
        pos = match.end()
    return "".join(out).strip("\n")


def _family(env_id: str) -> str:
    return env_id.split("/")[-1].split("-")[0].removesuffix("8x8")


class GymText(TextEnv):
    """A Gymnasium environment behind the text protocol (module docstring)."""

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        super().__init__()
        try:
            import gymnasium
        except ImportError:
            raise EnvError(f"environment '{PREFIX}{env_id}' needs gymnasium: pip install -e '.[envs]'") from None
        try:
            with warnings.catch_warnings():  # a missing ANSI rendering is an error below, not a warning
                warnings.simplefilter("ignore")
                self.env = gymnasium.make(env_id, render_mode="ansi", **kwargs)
        except gymnasium.error.Error as exc:
            raise EnvError(f"environment '{PREFIX}{env_id}': {exc}") from None
        except TypeError as exc:
            raise EnvError(f"environment '{PREFIX}{env_id}': bad option: {exc}") from None
        space = self.env.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise EnvError(f"environment '{PREFIX}{env_id}': only discrete actions are supported, not {space}")
        if "ansi" not in self.env.metadata.get("render_modes", ()):
            raise EnvError(f"environment '{PREFIX}{env_id}' has no text (ANSI) rendering")
        self.env_id, self.kwargs = env_id, kwargs
        self.known = KNOWN.get(_family(env_id))
        n = int(space.n)
        self.words = self.known.words if self.known and len(self.known.words) == n else tuple(f"a{i}" for i in range(n))
        if self.known:
            self.budget = self.known.budget
        self.observation: Any = None
        self._values: dict[Any, float] | None = None  # value iteration's, for the expert

    @property
    def action_words(self) -> tuple[str, ...]:
        return self.words

    @property
    def instructions(self) -> str:
        known = self.known
        task = known.task if known else f"Play the Gymnasium environment {self.env_id} to its goal."
        legend = f" Legend: {known.legend}" if known else ""
        return f"{task}{legend} Actions: {', '.join(self.words)}."

    def _reset(self, seed: int) -> None:
        self.observation, _ = self.env.reset(seed=seed)

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        self.observation, reward, terminated, truncated, _ = self.env.step(self.words.index(action))
        if terminated:
            self.success = float(reward) > 0 if self.known is None or self.known.success_needs_reward else True
        self.done = bool(terminated or truncated)
        return float(reward), {}

    def render(self) -> str:
        return plain(str(self.env.render()))

    def optimal_action(self, gamma: float = 0.99, sweeps: int = 500) -> str:
        """The best action by value iteration over the transition table ``P``."""
        table = getattr(self.env.unwrapped, "P", None)
        if table is None:
            raise EnvError(f"environment '{PREFIX}{self.env_id}' publishes no transition table: no expert")
        values = self._values if self._values is not None else dict.fromkeys(table, 0.0)

        def worth(s: Any, a: int) -> float:
            return sum(p * (r + (0.0 if done else gamma * values[n])) for p, n, r, done in table[s][a])

        for _ in range(0 if self._values is not None else sweeps):
            delta = 0.0
            for s in table:
                best = max(worth(s, a) for a in table[s])
                delta, values[s] = max(delta, abs(best - values[s])), best
            if delta < 1e-9:
                break
        self._values = values  # the table is the instance's: solved once
        state = int(self.observation)
        return self.words[max(table[state], key=lambda a: worth(state, a))]


def make_gym(env_id: str, **options: Any) -> GymText:
    """`gym:<id>` with `options` passed to ``gymnasium.make``."""
    return GymText(env_id, **options)
