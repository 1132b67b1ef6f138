"""The text-environment protocol.

    env = envs.make("sokoban", **options)
    text = env.reset(seed=7)                      # same seed -> same initial state
    text = env.reset(seed=7, split="validation")  # a state no training episode starts from
    text, reward, done, info = env.step("Up")     # one action word
    info["success"], info["action_valid"]         # always present
    env.render(); env.action_words; env.instructions

An action that is not valid never raises: it is reported with
``info["action_valid"] = False``, costs nothing, and leaves the state unchanged.
Environments with free-form actions (countdown's expressions) have empty
`action_words` and say what they accept in `instructions`.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from common.errors import UserError

StepResult = tuple[str, float, bool, dict[str, Any]]


#: one initial state in HOLD_OUT_EVERY (by the hash of its content) is for validation only
HOLD_OUT_EVERY = 8
#: draws before `reset` gives up finding a state of the wanted split
MAX_DRAWS = 1000


class EnvError(UserError):
    """An unknown environment, a bad option, or an unreachable served environment."""


class EnvFault(EnvError):
    """An environment that failed while an episode was played (a served environment's
    server error, a late answer, a dropped connection, a reply that is not what the
    protocol says). The agent loop drops that episode and counts it
    (`stages.agent.play`); met while a spec is checked, it is a one-line error like
    any `EnvError`."""


@dataclass(frozen=True)
class Budget:
    """The reference's per-environment interaction budget (the agent loop's defaults)."""

    max_turns: int
    max_actions_per_traj: int
    max_actions_per_turn: int


class TextEnv(ABC):
    """Base class of the text environments (see the module docstring)."""

    #: registered name, set by the registry
    name: str = ""
    #: the reference's budget for this environment
    budget: Budget = Budget(max_turns=5, max_actions_per_traj=10, max_actions_per_turn=5)
    #: the agent program ('module:function') that must play it, where it plays its own
    #: rollout (`envs.verifiers_env`); None: any agent plays it
    program: str | None = None

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.done = False
        self.success = False

    @property
    @abstractmethod
    def action_words(self) -> tuple[str, ...]:
        """The action words (empty for free-form actions)."""

    @property
    @abstractmethod
    def instructions(self) -> str:
        """Task text, symbol legend and action words, for the first prompt."""

    @property
    def example_action(self) -> str:
        """An action the prompt's format example shows (`agent.example`): the first
        action word; environments with free-form actions say their own."""
        return self.action_words[0] if self.action_words else "..."

    @abstractmethod
    def _reset(self, seed: int) -> None:
        """Build the initial state from `self.rng` (already seeded)."""

    @abstractmethod
    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        """Apply one valid action; return its reward and extra info."""

    @abstractmethod
    def render(self) -> str:
        """The current state as text."""

    def close(self) -> None:  # noqa: B027  (an optional hook: most environments hold nothing)
        """Free what the environment holds outside this process (a served one's place on
        its server); a local one holds nothing. Also the end of a ``with`` block."""

    def __enter__(self) -> TextEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def parse_action(self, action: str) -> str | None:
        """The canonical action word for `action`, or None if it is not valid."""
        wanted = action.strip().lower()
        for word in self.action_words:
            if word.lower() == wanted:
                return word
        return None

    def content(self) -> str | None:
        """The initial state's full content (e.g. a lake's start, goal and holes, whatever
        the view shows), for environments with enough distinct states to hold some out;
        None (the default) holds nothing out."""
        return None

    def held_out(self) -> bool | None:
        """Whether the current initial state is one only validation episodes start from
        (one in `HOLD_OUT_EVERY` by the hash of `content`); None if nothing is held out."""
        text = self.content()
        if text is None:
            return None
        return hashlib.sha256(text.encode()).digest()[0] % HOLD_OUT_EVERY == 0

    def reasoning(self) -> str | None:
        """A thought about the current state that a scripted demonstration writes before
        its answer (`stages.agent.scripted`), or None for the generic one (the moves it makes)."""
        return None

    def reasoning_holds(self, think: str, action: str) -> bool | None:
        """Whether a thought about the current state is right about it and `action`
        (the turn's first) follows from it, by this environment's rule: what a
        reasoning-aware reward pays for (`agent.reasoning_bonus`). None (the default):
        the environment has no such rule."""
        return None

    def split_problem(self, split: str) -> str | None:
        """Why no episode of `split` ("train" or "validation") can start here, found
        without playing (checked before a run starts: `stages.agent.play.check_env`);
        None when one can, or when that is only known by drawing states."""
        return None

    def reset(self, seed: int, split: str | None = None) -> str:
        """The initial state of `seed`. With `split` ("train" or "validation"), an
        environment that holds states out (`held_out`) draws again, from seeds derived
        from `seed`, until the state belongs to the split: no validation episode starts
        from a state a training or warm-start episode can start from."""
        for draw in range(MAX_DRAWS):
            drawn = seed if draw == 0 else int.from_bytes(hashlib.sha256(f"{seed}/{draw}".encode()).digest()[:6], "big")
            self.rng = random.Random(drawn)
            self.seed = seed
            self.done = False
            self.success = False
            self._reset(drawn)
            held = self.held_out() if split is not None else None
            if held is None or held == (split == "validation"):
                return self.render()
        raise EnvError(f"{self.name}: no {split} state in {MAX_DRAWS} draws from seed {seed}")

    def step(self, action: str) -> StepResult:
        word = self.parse_action(action) if isinstance(action, str) and not self.done else None
        if word is None:
            return self.render(), 0.0, self.done, {"success": self.success, "action_valid": False}
        reward, info = self._step(word)
        return self.render(), float(reward), self.done, {**info, "success": self.success, "action_valid": True}


class OneAnswer(TextEnv):
    """One question, one free-text answer, scored (task records, reasoning-gym). A
    subclass says the question (`question`), the instructions (`opts.instructions`) and
    how an answer scores (`_step`, after `answered`); the state after it repeats the
    answer given."""

    budget = Budget(max_turns=1, max_actions_per_traj=1, max_actions_per_turn=1)
    opts: Any  # the subclass's options, with an `instructions` field
    given: str | None = None

    @property
    def action_words(self) -> tuple[str, ...]:
        return ()  # free text

    @property
    def instructions(self) -> str:
        return str(self.opts.instructions)

    @property
    def example_action(self) -> str:
        return "42"

    @abstractmethod
    def question(self) -> str:
        """The text of this episode's question."""

    def reference(self) -> str | None:
        """This question's reference answer (what the `expert` policy answers), or None
        where there is none to give."""
        return None

    def other_answer(self, rng: random.Random) -> str | None:
        """The reference answer of a question drawn by `rng` (what `random_valid` answers:
        an answer of the task's form, mostly to another question), or None."""
        return None

    def render(self) -> str:
        text = self.question()
        return text if self.given is None else f"{text}\nYour answer: {self.given}"

    def answered(self, action: str) -> None:
        """Note `action` as the answer: the episode is over."""
        self.given, self.done = action, True
