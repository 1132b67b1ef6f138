"""`agent.program:` — which agent program of your own plays the episodes, through the
OpenAI-compatible endpoint in front of the policy (agent mode: `stages.endpoint`,
docs/agents.md). Only the setting lives here, so that the agent loop's config holds it;
running programs is `stages.endpoint.programs`."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from common.code import fingerprint
from common.config import ConfigProblem, param

_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def findable(module: str) -> bool:
    """Whether `module` can be imported from the working directory or the path, found
    without importing it (the module is the user's, and may be heavy)."""
    top = module.partition(".")[0]
    if importlib.machinery.PathFinder.find_spec(top, [str(Path.cwd())]) is not None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def module_code(module: str) -> str:
    """The fingerprint of `module`'s code (`common.code`), found from the path or the
    working directory (put on the path, as running the program does)."""
    here = str(Path.cwd())
    if here not in sys.path:
        sys.path.append(here)
    return fingerprint(module, ())


def command_code(command: tuple[str, ...]) -> str:
    """A digest of a command's files: every argument that is a file, and the module after ``-m``."""
    h = hashlib.sha256()
    for k, arg in enumerate(command):
        if k and command[k - 1] == "-m":
            h.update(f"{arg}:{module_code(arg)}\n".encode())
        elif Path(arg).is_file():
            h.update(f"{arg}:{hashlib.sha256(Path(arg).read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ProgramConfig:
    """`agent.program:` — an agent program of your own, acting through the endpoint."""

    function: str | None = param(
        None, "a Python callable 'module:function' called once per episode with an AgentTask (docs/agents.md)"
    )
    command: tuple[str, ...] = param(
        (), "or a command run once per episode, the task in its environment (docs/agents.md)"
    )
    timeout: float = param(
        60.0, "seconds of the program's own time per episode (its calls' time not counted); past it: a fault", gt=0
    )
    reward: str | None = param(
        None, "'module:function' scoring an episode from (task, result); unset: the environment's rewards"
    )
    success_at: float | None = param(
        None,
        "with reward: a score at or above it counts as a success (a task graded on its answer); unset: the "
        "environment's success",
    )
    model: str = param("policy", "the model name the program is given (any name is served)", key=False)
    pass_env: tuple[str, ...] = param(
        (),
        "names of this process's environment variables a command also gets (it gets PATH, HOME, the locale and "
        "its task, never the run's credentials unless named here)",
        key=False,
    )
    revision: str = param(
        "",
        "a label of your own in the result keys: change it when something outside the program's code changes "
        "what it does (a package it imports, a file or service it reads), and its episodes play again",
        key=False,
    )

    def __post_init__(self) -> None:
        if self.function and self.command:
            raise ConfigProblem("function", "set function or command, not both")
        if self.success_at is not None and not self.reward:
            raise ConfigProblem("success_at", "a success threshold is for a reward function's score: set reward too")
        for name in ("function", "reward"):
            value = getattr(self, name)
            if value is None:
                continue
            if not _TARGET.fullmatch(value):
                raise ConfigProblem(name, f"expected 'module:function', got {value!r}")
            module = value.partition(":")[0]
            if not findable(module):
                raise ConfigProblem(
                    name, f"no module '{module}' on the path (the working directory, or an installed package)"
                )

    def key_extra(self) -> dict[str, object]:
        """The code of the program and the reward function, for the result keys
        (`catalog.keys`): an edited agent is played again, not read from the catalog. A
        module counts with the modules of its own package it imports (`common.code`); a
        command, with every file among its arguments and a ``-m`` module."""
        code = {
            name: module_code(getattr(self, name).partition(":")[0])
            for name in ("function", "reward")
            if getattr(self, name)
        }
        if self.command:
            code["command"] = command_code(self.command)
        extra: dict[str, object] = {"program_code": code} if code else {}
        if self.revision:  # in the key only when set: the keys of a program without one stay as they were
            extra["program_revision"] = self.revision
        return extra

    @property
    def active(self) -> bool:
        """Whether a program plays the episodes (else our own agent loop does)."""
        return bool(self.function or self.command)
