"""A user's own stages, imported before a spec is loaded.

Three ways, all before the spec's stage names are looked up:

- the spec's ``imports:`` (a list of module names), resolved from the spec's folder,
  then the working directory, then the installed packages;
- ``--import MODULE`` on `pipeline validate`, `show`, `explain` and `run` (the same
  resolution, from the working directory);
- an installed package's entry points in the group ``starpo_pipeline.stages``
  (``[project.entry-points."starpo_pipeline.stages"] mine = "my_package.stages"``),
  loaded for every spec.

A module that cannot be imported is one line naming it (exit 2); the error it raised
is part of the line.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

from common.errors import UserError

#: the entry-point group an installed package registers its stage modules under
GROUP = "starpo_pipeline.stages"


def import_modules(modules: Iterable[str], folders: Iterable[Path], where: str) -> None:
    """Import each of `modules`, looking in `folders` first (added to ``sys.path``);
    `where` names what asked for them in an error (``imports`` of a file, ``--import``)."""
    modules = list(modules)
    if not modules:  # nothing asked for: sys.path is left as it is
        return
    for folder in folders:
        text = str(folder.resolve())
        if text not in sys.path:
            sys.path.insert(0, text)
    for name in modules:
        if not isinstance(name, str) or not name.replace(".", "").replace("_", "").isalnum():
            raise UserError(f"{where}: {name!r} is not a module name (expected e.g. my_project.stages)")
        try:
            importlib.import_module(name)
        except Exception as exc:  # the user's module: whatever it raised, one line
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            raise UserError(f"{where}: cannot import module '{name}' ({why})") from None


@cache
def load_entry_points() -> tuple[str, ...]:
    """Import the stage modules installed packages declare (`GROUP`), once per process."""
    loaded = []
    for ep in entry_points(group=GROUP):
        try:
            ep.load()
        except Exception as exc:
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            raise UserError(
                f"entry point '{ep.name}' ({ep.value}) of group {GROUP}: cannot import it ({why})"
            ) from None
        loaded.append(ep.value)
    return tuple(loaded)
