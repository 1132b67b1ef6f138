"""How stage configs are written: frozen dataclasses whose fields say what they mean.

Every field is declared with `param(...)`, which is where it is documented, once:

    lr: float = param(1e-6, "actor learning rate (per optimiser step)", gt=0, paper=1e-6)

The spec loader (`pipelines.spec.typed`) reads the same metadata to check types and
ranges and to print field docs; the key derivation skips fields with ``key=False``
(settings that cannot change a result, such as a progress flag).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any


class ConfigProblem(ValueError):
    """Raised from a config's ``__post_init__`` for a cross-field mistake; `field`
    names the offending field so the error can point at its key."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def param(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    paper: Any = None,
    key: bool = True,
    choices: Any = None,
) -> Any:
    """A documented config field. `ge`/`gt`/`le`/`lt` bound numbers; `paper` is the
    paper's value where the default differs; `key=False` keeps it out of cache keys;
    `choices` (a `common.choices.Choices`, for a field typed with its Literal) adds
    every option's doc to the field's and names the kind in an unknown-name error."""
    if choices is not None:
        doc = f"{doc}: {choices.doc()}"
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "paper": paper, "key": key, "choices": choices}
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple or a frozen mapping for a config default, not a mutable value")
    return field(default=default, metadata=meta)


def bounds_text(meta: Mapping[str, Any]) -> str:
    """The range of a numeric field as text, e.g. '>= 1 and <= 64' ('' if unbounded)."""
    parts = [
        f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if meta.get(k) is not None
    ]
    return " and ".join(parts)
