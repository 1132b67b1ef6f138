"""The project's one error hierarchy.

Every package imports `common`, so the base classes live here. The CLI turns a
`UserError` into one line on stderr and exit status 2; any other `PipelineError`
is reported as a failure of the run (exit 1), with the traceback kept on disk.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable

#: the most valid names an "unknown name" message lists
MAX_LISTED = 8


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice; else the valid names when they
    are few, or the nearest few of many and how many there are: the suffix of every
    "unknown name" message in the project, short enough for one line."""
    choices = sorted(set(choices))
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{close[0]}'?)"
    if not choices:
        return ""
    if len(choices) <= MAX_LISTED:
        return f" (expected one of: {', '.join(choices)})"
    nearest = difflib.get_close_matches(word, choices, n=MAX_LISTED // 2, cutoff=0.0)
    return f" (the nearest of {len(choices)}: {', '.join(nearest)})"


class PipelineError(Exception):
    """Base class of every error this project raises on purpose."""


class UserError(PipelineError):
    """A mistake in what the user asked for (a spec, an override, a name, a query).

    `str(error)` is the whole message: one line that names the file, key or value
    and says what was expected.
    """


class SpecError(UserError):
    """A spec that cannot be loaded or does not validate.

    Attributes:
        source: the file (or ``-o`` override) the offending value came from.
        path: the dotted key path inside the spec, or "" for the whole file.
        problem: what was wrong and what was expected.
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source, self.path, self.problem = source, path, problem
        shown = path if path.isprintable() else json.dumps(path)  # a key with a newline stays on one line
        where = f"{source}: {shown}" if path else source
        super().__init__(f"{where}: {problem}")


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM. Like KeyboardInterrupt, no stage catches
    it; `at` is the step it stopped in (``<iteration>:<node>``)."""

    def __init__(self, signum: int, at: str = "") -> None:
        self.signum, self.at = signum, at
        super().__init__(f"interrupted at {at or 'start'}")


class CatalogError(PipelineError):
    """The catalog is unreadable, inconsistent, or was asked for something it lacks."""


class CatalogFull(CatalogError):
    """The catalog's disk filled while a step wrote its result; nothing of it was kept."""


class StageFailed(PipelineError):
    """A stage raised while running; nothing it wrote was committed."""

    def __init__(self, node: str, iteration: int | None, cause: BaseException | None, details: str = "") -> None:
        self.node, self.iteration, self.cause = node, iteration, cause
        self.details = details  # the stage's traceback, as text (kept in runs/<run>/error.txt)
        at = "" if iteration is None else f" (iteration {iteration})"
        super().__init__(f"stage '{node}'{at} failed: {type(cause).__name__}: {cause}")

    def __reduce__(self) -> tuple:  # crosses process boundaries (sweep trials run as Ray actors)
        return _stage_failed, (str(self), self.node, self.iteration, self.details)


def _stage_failed(message: str, node: str, iteration: int | None, details: str = "") -> StageFailed:
    """A StageFailed rebuilt from its message (its cause may not survive pickling)."""
    error = StageFailed.__new__(StageFailed)
    Exception.__init__(error, message)
    error.node, error.iteration, error.cause, error.details = node, iteration, None, details
    return error
