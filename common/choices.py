"""Named variants chosen in a spec: one registry entry per variant, with its doc and
what it needs.

    ESTIMATORS = Choices("estimator", Estimator, [
        Choice("gae", "token-level GAE on the critic's values", "stages.rl.estimators:estimate_gae",
               needs={"critic"}),
        ...])

`Estimator` is the ``Literal`` of the names that the config field is typed with, so
the spec loader rejects an unknown name with a "did you mean" when the spec is
loaded; `Choices` refuses, at import, a Literal that differs from its entries. An
entry names its implementation as ``"module:attribute"`` and imports it on first
call, so checking a spec imports neither torch nor an engine. Calling an entry calls
the implementation.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Choice:
    """One variant: its name, a one-line doc, where it is implemented
    (``"module:attribute"``) and the traits it needs from the pipeline (e.g.
    ``{"critic"}``)."""

    name: str
    doc: str
    target: str
    needs: frozenset[str] = field(default_factory=frozenset)

    def load(self) -> Any:
        """The implementation (imported on first use)."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


class Choices(Mapping[str, Choice]):
    """The registry of one kind of variant (see the module docstring)."""

    def __init__(self, kind: str, names: Any, entries: Iterable[Choice]) -> None:
        self.kind = kind
        self._entries = {c.name: c for c in entries}
        declared = typing.get_args(names)
        if list(declared) != list(self._entries):
            raise TypeError(f"{kind}: the Literal {declared} and the entries {tuple(self._entries)} differ")

    def __getitem__(self, name: str) -> Choice:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def needs(self, name: str, trait: str) -> bool:
        """Whether variant `name` needs `trait` (False for an unknown name)."""
        entry = self._entries.get(name)
        return entry is not None and trait in entry.needs

    def doc(self) -> str:
        """Every variant with its doc, for a config field's documentation."""
        return "; ".join(f"{c.name}: {c.doc}" for c in self._entries.values())
