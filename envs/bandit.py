"""Bi-arm bandit (docs/method.md#environments): a low-risk arm paying 0.1 always, a high-risk arm paying
1.0 with p=0.25 (expected 0.25 > 0.1). One step; success = chose the arm with the larger expected
payoff (the high-risk arm, unless its odds make it the worse). The arms' order in the prompt is
shuffled at each reset.

Two options go beyond the paper's bandit (docs/history.md#names-it-has-never-seen):
``payoffs`` makes the prompt say what each arm pays, so that a policy can read which arm is
which instead of learning a name; ``names`` is a pool from which each reset draws the two
arms' names and gives them their roles at random, so that no name carries the answer; ``odds`` is a
pool from which each reset draws the high-risk arm's probability of paying, so that the gamble is
sometimes the worse arm and "answer the gamble" is not the rule that pays.
With the payoffs stated, `Bandit.reasoning_holds` checks a thought by rule: it states both
arms' expected payoffs right, and the answer is the arm it says pays more."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from envs.base import Budget, TextEnv

#: the first state's line: "Arms: <first>, <second>. Which arm do you pull?" (names hold no comma)
_ARMS = re.compile(r"Arms: ([^,\n]+), ([^\n]+?)\. Which arm do you pull\?")
#: what the prompt prints a number with (`:g`): 6 significant digits, a relative error up to 5e-6
SAID_TO = 5e-6


def arms_of(state: str) -> tuple[str, str] | None:
    """The two arms a first state offers, in its order (None for another state)."""
    found = _ARMS.match(state or "")
    return (found.group(1), found.group(2)) if found else None


def stated_expectations(think: str, arms: tuple[str, ...]) -> dict[str, set[float]]:
    """What a thought says each of `arms` pays on average ("<arm> pays <value> on average",
    or with its product "<arm> pays 1 x 0.25 = 0.25 on average"; the name in any case):
    every value it states for that arm (two different values for one arm state nothing
    right)."""
    out: dict[str, set[float]] = {}
    for arm in arms:
        pattern = rf"(?<![\w-]){re.escape(arm)} pays (?:[\d.]+ x [\d.]+ = )?([\d.]+) on average"
        for value in re.findall(pattern, think or "", flags=re.IGNORECASE):
            try:
                out.setdefault(arm, set()).add(float(value))
            except ValueError:  # "1.2.3"
                out.setdefault(arm, set()).add(math.nan)
    return out


@dataclass(frozen=True)
class Judged:
    """A thought judged by the bandit's rule: it `states` one value for each arm; they are
    `right` (each the arm's expected payoff, as the prompt prints numbers); the answer
    `follows` (an arm the thought says pays most: either on a tie). None: not judged."""

    states: bool
    right: bool | None
    follows: bool | None

    @property
    def holds(self) -> bool:
        return self.states and bool(self.right) and bool(self.follows)


def judge(arms: tuple[str, ...], think: str, action: str | None, expected: dict[str, float]) -> Judged:
    """The rule (`Judged`) for a thought and answer, given what each arm pays on average."""
    stated = stated_expectations(think, arms)
    if not all(len(stated.get(arm, ())) == 1 for arm in arms):
        return Judged(False, None, None)
    said = {arm: next(iter(stated[arm])) for arm in arms}
    right = all(math.isclose(said[a], expected[a], rel_tol=SAID_TO, abs_tol=1e-9) for a in arms)
    top = max(said.values())
    chosen = [a for a in arms if a.casefold() == (action or "").strip().casefold()]
    return Judged(True, right, bool(chosen) and said[chosen[0]] == top)


@dataclass(frozen=True)
class BanditOptions:
    low_arm: str = "Phoenix"  # name of the low-risk arm
    high_arm: str = "Dragon"  # name of the high-risk arm
    low_reward: float = 0.1  # the low-risk arm's sure payoff
    high_reward: float = 1.0  # the high-risk arm's payoff when it pays
    high_p: float = 0.25  # probability that the high-risk arm pays
    payoffs: bool = False  # the prompt says what each arm pays
    names: tuple[
        str, ...
    ] = ()  # a pool: each reset draws both names and their roles from it (low_arm / high_arm unused)
    odds: tuple[float, ...] = ()  # a pool: each reset draws the high-risk arm's probability from it (high_p unused)

    def __post_init__(self) -> None:
        if self.low_arm.strip().lower() == self.high_arm.strip().lower():
            raise ValueError(f"the two arms need different names, got '{self.low_arm}' twice")
        if not 0.0 <= self.high_p <= 1.0:
            raise ValueError(f"high_p must be in [0, 1], got {self.high_p}")
        if not all(0.0 <= p <= 1.0 for p in self.odds):
            raise ValueError(f"odds are probabilities in [0, 1], got {list(self.odds)}")
        pool = [n.strip().lower() for n in self.names]
        if self.names and (len(set(pool)) < 2 or len(set(pool)) != len(pool) or not all(pool)):
            raise ValueError(f"names needs two or more different non-empty names, got {list(self.names)}")
        for name in (*self.names, self.low_arm, self.high_arm):
            if "," in name or "\n" in name or name != name.strip() or not name:
                raise ValueError(f"arm name {name!r}: expected a name without commas, line breaks or outer spaces")


class Bandit(TextEnv):
    budget = Budget(max_turns=1, max_actions_per_traj=1, max_actions_per_turn=1)

    def __init__(self, opts: BanditOptions) -> None:
        super().__init__()
        self.opts = opts
        self.low, self.high = opts.low_arm, opts.high_arm
        self.p = opts.high_p  # the high-risk arm's probability of paying, this episode
        self.order: tuple[str, ...] = (self.low, self.high)
        self.last: str | None = None

    @property
    def action_words(self) -> tuple[str, ...]:
        return self.order

    def pays(self, arm: str) -> str:
        """What `arm` pays, in words."""
        o = self.opts
        if arm == self.high:
            return f"{arm} pays {o.high_reward:g} with probability {self.p:g}, otherwise 0"
        return f"{arm} pays {o.low_reward:g} every time"

    def expected(self, arm: str) -> float:
        """What `arm` pays on average."""
        o = self.opts
        return o.high_reward * self.p if arm == self.high else o.low_reward

    @property
    def best(self) -> str:
        """The arm with the larger expected payoff (either is right on a tie, as `_step` and
        `judge` count it; the demonstrator takes the high-risk one)."""
        return self.high if self.expected(self.high) >= self.expected(self.low) else self.low

    def reasoning(self) -> str | None:
        """With the payoffs in the prompt, a demonstration's thought works out what each
        arm pays on average, in the prompt's order (and does not say which to pull)."""
        if not self.opts.payoffs:
            return None
        o = self.opts
        sums = {
            self.high: f"{o.high_reward:g} x {self.p:g} = {self.expected(self.high):g}",
            self.low: f"{o.low_reward:g}",
        }
        return " " + " ".join(f"{arm} pays {sums[arm]} on average." for arm in self.order) + " "

    def reasoning_holds(self, think: str, action: str) -> bool | None:
        """With the payoffs in the prompt: the thought states each arm's expected payoff,
        once and right, and `action` is an arm it says pays most (`judge`; None without
        the payoffs)."""
        if not self.opts.payoffs:
            return None
        return judge(self.order, think, action, {arm: self.expected(arm) for arm in self.order}).holds

    @property
    def instructions(self) -> str:
        payoffs = f" {'. '.join(self.pays(a) for a in self.order)}." if self.opts.payoffs else ""
        return (
            f"You are playing a bandit game. There are two arms, {self.order[0]} and {self.order[1]}.{payoffs} "
            f"Each pull gives a reward; your goal is to maximise the expected reward. "
            f"Answer with the name of one arm. Actions: {', '.join(self.order)}."
        )

    def _reset(self, seed: int) -> None:
        if self.opts.names:
            self.low, self.high = self.rng.sample(list(self.opts.names), 2)
        arms = [self.low, self.high]
        self.rng.shuffle(arms)
        self.order = tuple(arms)
        self.p = self.rng.choice(self.opts.odds) if self.opts.odds else self.opts.high_p
        self.last = None

    def render(self) -> str:
        if self.last is None:
            return f"Arms: {self.order[0]}, {self.order[1]}. Which arm do you pull?"
        return f"You pulled {self.last}."

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        self.last = action
        if action == self.high:
            reward = self.opts.high_reward if self.rng.random() < self.p else 0.0
        else:
            reward = self.opts.low_reward
        self.done, self.success = True, self.expected(action) >= max(map(self.expected, self.order))
        return reward, {"arm": action}
