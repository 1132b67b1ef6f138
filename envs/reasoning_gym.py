"""reasoning-gym tasks as text environments: ``env: reasoning_gym``.

    envs.make("reasoning_gym", task="leg_counting")
    envs.make("reasoning_gym", task="basic_arithmetic", config={"min_terms": 2, "max_terms": 3})

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates verifiable
reasoning problems (arithmetic, logic, games, graphs: about a hundred tasks). Each
episode is one problem: the seed picks it (item ``seed`` of the task's dataset, made
with ``config`` as `reasoning_gym.create_dataset` takes it; 101 of its 106 tasks make
items on demand, and acre, gsm_symbolic and list_functions need a ``size``), the prompt is its
question, and the answer is scored by the task's own ``score_answer``: that score is
the reward (0 to 1), and success is a full score. One turn, as the tasks are. One
problem in eight, by the hash of its question, is held out for validation, as every
environment's states are (`envs.base`). Needs the ``reasoning-gym`` package
(``pip install -e '.[ecosystem]'``).
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, field
from typing import Any

from common.errors import did_you_mean
from envs.base import EnvError, OneAnswer

#: the size given to a task's dataset by default: every seed a run derives indexes an item of it
SIZE = 2**62


@dataclass(frozen=True)
class ReasoningGymOptions:
    task: str = "leg_counting"  # the task's name, as reasoning_gym.create_dataset takes it
    config: dict[str, Any] = field(default_factory=dict)  # the task's own options (its config class's fields)
    size: int | None = (
        None  # items the dataset holds (None: SIZE, made on demand); tasks that make theirs up front need one
    )
    instructions: str = "Solve the problem. Put only the final answer in the answer tags."

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        dataset(self)  # an unknown task or option fails here, in the package's words


def dataset(opts: ReasoningGymOptions) -> Any:
    """The task's dataset (items made on demand: item i is the same for the same config)."""
    try:
        with warnings.catch_warnings():  # one of its dependencies' sources warns when first compiled
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
            from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ValueError(
            "needs the reasoning-gym package: pip install -e '.[ecosystem]' (or pip install reasoning-gym)"
        ) from None
    if opts.task not in DATASETS:
        raise ValueError(f"task '{opts.task}': not a reasoning-gym task{did_you_mean(opts.task, sorted(DATASETS))}")
    if not isinstance(opts.config, dict) or {"seed", "size"} & set(opts.config):
        raise ValueError("config: expected the task's options as a mapping, without seed or size (the episode's)")
    try:
        return reasoning_gym.create_dataset(opts.task, **{**opts.config, "seed": 0, "size": opts.size or SIZE})
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(f"task '{opts.task}' config: {exc}") from None


class ReasoningGym(OneAnswer):
    """One reasoning-gym problem an episode (see the module docstring)."""

    def __init__(self, opts: ReasoningGymOptions) -> None:
        super().__init__()
        self.opts = opts
        self.data = dataset(opts)
        self.entry: dict[str, Any] = {}

    def parse_action(self, action: str) -> str | None:
        """Any answer is scored, save an empty one or one holding the action separator
        ``||`` (several actions where the task takes one answer): those are invalid."""
        answer = action.strip()
        return answer if answer and "||" not in answer else None

    def _item(self, index: int) -> dict[str, Any]:
        """Item `index` of the task's dataset (modulo its size)."""
        try:
            return self.data[index % (self.opts.size or SIZE)]
        except Exception as exc:  # the package's own generator failed for this item
            raise EnvError(f"reasoning_gym task '{self.opts.task}': item {index} failed: {exc}") from None

    def _reset(self, seed: int) -> None:
        self.entry = self._item(seed)
        self.given = None

    def content(self) -> str:
        return str(self.entry.get("question", ""))

    def question(self) -> str:
        return str(self.entry["question"])

    def reference(self) -> str | None:
        answer = self.entry.get("answer")
        return None if answer is None else str(answer)

    def other_answer(self, rng: random.Random) -> str | None:
        answer = self._item(rng.randrange(self.opts.size or SIZE)).get("answer")
        return None if answer is None else str(answer)

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        self.answered(action)
        score = float(self.data.score_answer(action, self.entry))
        score = score if math.isfinite(score) else 0.0
        self.success = score >= 1.0
        return score, {"score": score}
