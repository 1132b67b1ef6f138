"""Plain YAML data -> frozen, typed config objects, with errors that point at a key.

Supports the field types configs use: bool, int, float, str, None, Literal[...],
unions of those, tuple[T, ...], dict[str, T] and nested dataclasses. Numbers are
checked against the bounds given in `common.config.param`; a name from a registry
(`common.choices`) that is not one is reported as unknown, with the nearest. Floats written the way
people write them (``1e-5``, which YAML reads as a string) are accepted.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

from common.config import ConfigProblem, bounds_text
from common.errors import SpecError, did_you_mean

Where = Callable[[str], str]


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


#: the longest type description an error prints whole; a longer one is named by its shape
SHORT_TYPE = 48


def type_name(tp: Any) -> str:
    """A user-facing name of a field type: whole when short (``an integer or null``),
    else by its outer shape (``a mapping or null``), so a message stays readable."""
    full = _type_name(tp, deep=True)
    return full if len(full) <= SHORT_TYPE else _type_name(tp, deep=False)


def _type_name(tp: Any, deep: bool) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        names = list(dict.fromkeys(_type_name(a, deep) for a in typing.get_args(tp)))
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    if origin is tuple:
        return f"a list of {_plural(typing.get_args(tp)[0])}" if deep else "a list"
    if origin in (dict, Mapping):
        return f"a mapping to {_plural(typing.get_args(tp)[1])}" if deep else "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _plural(tp: Any) -> str:
    """`tp`'s name as the items of a container: ``integers``, ``strings`` (else the
    singular name, e.g. ``a list of one of 'a', 'b'``)."""
    return {bool: "booleans", int: "integers", float: "numbers", str: "strings"}.get(tp, _type_name(tp, deep=True))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def convert(tp: Any, value: Any, path: str, where: Where, meta: Mapping[str, Any] | None = None) -> Any:
    """Check `value` against type `tp` and return it in canonical form."""
    origin = typing.get_origin(tp)
    fail = SpecError(where(path), path, f"expected {type_name(tp)}, got {_shown(value)}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path, where)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        options = [str(a) for a in typing.get_args(tp)]
        hint = did_you_mean(str(value), options) if isinstance(value, str) else ""
        choices = (meta or {}).get("choices")
        if choices is not None and isinstance(value, str):  # a registry's name: "unknown estimator 'x'"
            raise SpecError(where(path), path, f"unknown {choices.kind} {value!r}{hint}")
        raise SpecError(where(path), path, f"expected {type_name(tp)}, got {_shown(value)}{hint}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        for arg in args:
            try:
                return convert(arg, value, path, where, meta)
            except SpecError:
                continue
        others = [a for a in args if a is not type(None)]
        if value is not None and len(others) == 1:  # `X | None`: X's own message (e.g. its bounds)
            convert(others[0], value, path, where, meta)
        raise fail
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise fail
        item = typing.get_args(tp)[0]
        return tuple(convert(item, v, f"{path}[{i}]", where, meta) for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise fail
        item = typing.get_args(tp)[1]
        return {str(k): convert(item, v, join(path, str(k)), where, meta) for k, v in value.items()}
    if tp is type(None):
        if value is None:
            return None
        raise fail
    return _scalar(tp, value, path, where, meta or {}, fail)


def _scalar(tp: Any, value: Any, path: str, where: Where, meta: Mapping[str, Any], fail: SpecError) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail
    if tp is str:
        if isinstance(value, str):
            return value
        raise fail
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail
    elif tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise fail from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail
        value = float(value)
        if not math.isfinite(value):  # .inf, .nan, 1e400: no setting means them, and a run would fail on one
            raise SpecError(where(path), path, f"expected a finite number, got {value!r}")
    else:
        raise TypeError(f"unsupported config field type {tp!r} at {path}")
    _check_bounds(value, path, where, meta)
    return value


#: the largest integer a setting may take unless its own bound says otherwise: no count,
#: size or step of a run comes near it, and every one fits a 32-bit index
MAX_INT = 2**31 - 1


def _check_bounds(value: float, path: str, where: Where, meta: Mapping[str, Any]) -> None:
    if isinstance(value, int) and meta.get("le") is None and meta.get("lt") is None and value > MAX_INT:
        shown = bounds_text(meta)
        raise SpecError(
            where(path), path, f"expected an integer {shown + ' and ' if shown else ''}<= {MAX_INT}, got {value!r}"
        )
    checks = (
        ("ge", lambda b: value >= b),
        ("gt", lambda b: value > b),
        ("le", lambda b: value <= b),
        ("lt", lambda b: value < b),
    )
    for name, ok in checks:
        bound = meta.get(name)
        if bound is not None and not ok(bound):
            kind = "an integer" if isinstance(value, int) else "a number"
            raise SpecError(where(path), path, f"expected {kind} {bounds_text(meta)}, got {value!r}")


def build(cls: type, data: Any, path: str, where: Where) -> Any:
    """Build the frozen dataclass `cls` from a mapping; unknown keys, wrong types,
    out-of-range numbers and cross-field problems raise `SpecError` at their key."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(where(path), path, f"expected a mapping of settings, got {_shown(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise SpecError(
                where(join(path, str(key))), join(path, str(key)), f"unknown key{did_you_mean(str(key), fields)}"
            )
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = convert(hints[name], data[name], join(path, name), where, f.metadata)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpecError(where(path), join(path, name), "is required")
    try:
        return cls(**values)
    except ConfigProblem as problem:
        at = join(path, problem.field)
        raise SpecError(where(at), at, problem.message) from None
