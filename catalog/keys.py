"""Content keys: how a stage result is addressed in the catalog.

A result's key is derived from everything that determines its content and nothing
else:

    key = "<stage>-" + sha256(canonical_json({
        "stage": registered stage name, "version": the stage's own version,
        "code": the fingerprint of the stage's code (`common.code`),
        "config": the stage config's fields (except those marked ``key=False``),
        "inputs": {parameter: input dataset address},
        "context": {"seed": run seed, "iteration": i or None for once-stages},
    }))[:16]

An input dataset's address is "<key>/<output name>", so keys form a Merkle DAG:
a changed setting changes its stage's key and, through the inputs, the key of every
stage downstream of it, and nothing else. The run name is deliberately not part of
the key, so two runs with the same settings (sweep trials sharing a warm start, a
re-run after a crash) share results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

KEY_HEX_CHARS = 16


def canonical(value: Any) -> Any:
    """Turn configs into plain JSON values with a stable form (dataclasses become
    dicts of their key-relevant fields, tuples become lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value) if f.metadata.get("key", True)
        }
        extra = getattr(value, "key_extra", None)  # what a config's values name but do not hold (a program's code)
        return {**fields, **canonical(extra())} if callable(extra) else fields
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def from_canonical(cls: type, values: dict[str, Any]) -> Any:
    """The frozen config `cls` from its canonical form (the inverse of `canonical` for a
    config: a resident policy's recipe is read back with it); fields left out of keys
    take their defaults."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value, hint = values[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_canonical(hint, value)  # type: ignore[arg-type]
        elif typing.get_origin(hint) is tuple:
            value = tuple(value)
        elif isinstance(value, str) and value in _NON_FINITE and float in _types(hint):
            value = float(value)  # `canonical` writes inf, -inf and nan as their repr
        kwargs[f.name] = value
    return cls(**kwargs)


_NON_FINITE = ("inf", "-inf", "nan")


def _types(hint: Any) -> tuple[Any, ...]:
    """The types a hint admits (the members of a union, else the hint)."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def canonical_json(value: Any) -> str:
    """The one serialisation that is hashed: sorted keys, no whitespace."""
    return json.dumps(canonical(value), sort_keys=True, separators=(",", ":"))


def result_key(
    stage: str,
    version: int,
    config: Any,
    inputs: Mapping[str, str],
    seed: int,
    iteration: int | None,
    code: str = "",
) -> str:
    """The catalog key of one stage execution (see the module docstring)."""
    payload = {
        "stage": stage,
        "version": version,
        "code": code,
        "config": config,
        "inputs": dict(inputs),
        "context": {"seed": seed, "iteration": iteration},
    }
    digest = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    return f"{stage.replace('.', '_')}-{digest[:KEY_HEX_CHARS]}"


def dataset_address(key: str, output: str, part: tuple[int, int] | None = None) -> str:
    """The address of one output dataset of a stage result; with `part` = (j, k),
    of its j-th of k equal row slices (``<key>/<output>[j/k]``: Online-k reuse)."""
    address = f"{key}/{output}"
    return address if part is None else f"{address}[{part[0]}/{part[1]}]"


def parse_address(address: str) -> tuple[str, str, tuple[int, int] | None]:
    """(key, output, part) of a dataset address (the inverse of `dataset_address`)."""
    key, output = address.split("/", 1)
    if not output.endswith("]"):
        return key, output, None
    output, _, part = output[:-1].partition("[")
    j, k = part.split("/")
    return key, output, (int(j), int(k))
