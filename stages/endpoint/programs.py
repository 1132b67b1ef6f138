"""The agent programs agent mode runs, one per episode (docs/agents.md).

A program is a Python callable named ``module:function``, called in a thread of the
engine host with an `AgentTask`, or a command, run with the task in its environment
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AGENT_MODEL``, ``AGENT_TASK`` as JSON and
``AGENT_ENV_URL``, where ``GET`` reads the environment and ``POST .../step`` with
``{"action": ...}`` acts on it). Either way it acts on the episode's environment, whose
rewards are its score, unless ``agent.program.reward`` names a function of the task and
the program's result (a callable's return value, a command's last line of output, as
JSON where it parses).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import live
from envs.base import StepResult, TextEnv
from stages.agent.program_config import ProgramConfig

__all__ = ["ActedEnv", "AgentTask", "Outcome", "ProgramConfig", "load", "run_command", "run_function"]


def load(target: str) -> Callable[..., Any]:
    """The callable ``module:function``; RuntimeError in one line when it cannot be had."""
    module, _, name = target.partition(":")
    here = str(Path.cwd())
    if here not in sys.path:  # a module of the working directory, as the spec check found it
        sys.path.append(here)
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:  # the user's module: whatever it raised, one line
        raise RuntimeError(f"agent program {target}: cannot load it ({type(exc).__name__}: {exc})") from None
    if not callable(fn):
        raise RuntimeError(f"agent program {target}: not callable")
    return fn


@dataclass
class Step:
    """One action the program took: after which call (0: before the first answer came
    back, or after the first), the action, whether it was valid, its reward."""

    call: int
    action: str
    valid: bool
    reward: float


class ActedEnv:
    """The episode's environment as the program sees it: `reset` is done, every `step`
    is recorded (with the number of answers the program had by then), and steps past
    the action budget change nothing and report ``done``."""

    def __init__(self, env: TextEnv, budget: int, calls: Callable[[], int]) -> None:
        self._env, self._budget, self._calls = env, budget, calls
        self.steps: list[Step] = []
        self._lock = threading.Lock()
        self._frozen = False

    def freeze(self) -> None:
        """From now on steps change nothing (the episode was ended: a fault, its time)."""
        with self._lock:
            self._frozen = True

    @property
    def instructions(self) -> str:
        return self._env.instructions

    @property
    def action_words(self) -> tuple[str, ...]:
        return self._env.action_words

    @property
    def done(self) -> bool:
        return self._frozen or self._env.done or len(self.steps) >= self._budget

    @property
    def success(self) -> bool:
        return bool(self._env.success)

    def render(self) -> str:
        return self._env.render()

    def close(self) -> None:
        """Free the environment (a served one's place on its server); the episode is over."""
        self._env.close()

    def parse_action(self, action: str) -> str | None:
        return self._env.parse_action(action)

    def step(self, action: str) -> StepResult:
        """One action word; past the episode's end or its budget: nothing changes."""
        with self._lock:
            if self.done:
                return self._env.render(), 0.0, True, {"success": self.success, "action_valid": False}
            obs, reward, _done, info = self._env.step(str(action))
            self.steps.append(Step(max(0, self._calls() - 1), str(action), bool(info.get("action_valid")), reward))
            return obs, reward, self.done, info

    def state(self) -> dict[str, Any]:
        """What ``GET AGENT_ENV_URL`` answers."""
        return {
            "observation": self.render(),
            "instructions": self.instructions,
            "actions": list(self.action_words),
            "done": self.done,
            "success": self.success,
        }


@dataclass
class AgentTask:
    """What a program is given for its episode: where to call (`base_url`, `api_key`),
    the `model` name, the environment it acts on (`env`, already reset: ``render()``,
    ``step(action)``, ``instructions``, ``action_words``, ``done``), and the episode's
    task: `env_name`, `options`, `seed`, `split`, `group`, `sample`, and on ``records``
    its task `record` (`envs.records`)."""

    base_url: str
    api_key: str
    model: str
    env: ActedEnv
    env_name: str
    options: dict[str, Any]
    seed: int
    split: str
    group: int
    sample: int
    env_url: str = ""
    record: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The task as JSON for a command (``AGENT_TASK``)."""
        keys = ("model", "env_name", "options", "seed", "split", "group", "sample", "record")
        return {k: getattr(self, k) for k in keys}


class Outcome:
    """How a program ended: its result, or the one-line fault that costs the episode."""

    def __init__(self) -> None:
        self.result: Any = None
        self.fault: str | None = None


def one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def run_function(
    fn: Callable[[AgentTask], Any], task: AgentTask, outcome: Outcome, done: Callable[[], None]
) -> threading.Thread:
    """Call `fn(task)` in a daemon thread; `done()` when it returns or raises."""

    def body() -> None:
        try:
            outcome.result = fn(task)
        except BaseException as exc:  # the user's program: whatever it raised costs its episode
            outcome.fault = f"the program raised {one_line(exc)}"
        finally:
            done()

    thread = live.thread(body, f"agent-{task.group}-{task.sample}")
    thread.start()
    return thread


#: what a command inherits of this process's environment: what a program needs to start and
#: print, never the run's credentials (cloud keys, tracking tokens), which are not its to see
PASSED_ENV = frozenset(
    {"PATH", "HOME", "USER", "LANG", "TZ", "TMPDIR", "TEMP", "TMP", "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT"}
)


def run_command(
    command: tuple[str, ...],
    task: AgentTask,
    outcome: Outcome,
    done: Callable[[], None],
    passed: tuple[str, ...] = (),
) -> tuple[threading.Thread, subprocess.Popen[str] | None]:
    """Start `command` with the task in its environment (and of this process's, only
    `PASSED_ENV` and the names in `passed`); a thread waits for it, reads its last line of
    output as the result, and calls `done()`."""
    env = {
        **{k: v for k, v in os.environ.items() if k in PASSED_ENV or k in passed or k.startswith("LC_")},
        "OPENAI_BASE_URL": task.base_url,
        "OPENAI_API_KEY": task.api_key,
        "AGENT_MODEL": task.model,
        "AGENT_TASK": json.dumps(task.as_json()),
        "AGENT_ENV_URL": task.env_url,
    }
    try:
        proc: subprocess.Popen[str] | None = subprocess.Popen(
            list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as exc:
        proc = None
        outcome.fault = f"the command could not start ({one_line(exc)})"

    def body() -> None:
        try:
            if proc is None:
                return
            out, err = proc.communicate()
            if proc.returncode != 0:
                last = (err.strip().splitlines() or [""])[-1]
                outcome.fault = f"the command exited with {proc.returncode}" + (f": {last[:200]}" if last else "")
                return
            lines = [line for line in out.splitlines() if line.strip()]
            if lines:
                try:
                    outcome.result = json.loads(lines[-1])
                except json.JSONDecodeError:
                    outcome.result = lines[-1]
        finally:
            done()

    thread = live.thread(body, f"agent-cmd-{task.group}-{task.sample}")
    thread.start()
    return thread, proc


def python_command(module: str) -> tuple[str, ...]:
    """The command that runs `module` with this interpreter (for tests and examples)."""
    return (sys.executable, "-m", module)
