"""The environment registry: names -> environment classes with preset options.

Variants are registered names with preset options (``sokoban_larger`` is
``sokoban`` with an 8x8 room and 2 boxes); any option can also be given to `make`.
A prefix names a family of environments from another library: ``gym:<id>`` is
any Gymnasium environment with a text rendering (`register_prefix`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from common.errors import did_you_mean
from envs.base import EnvError, TextEnv

_REGISTRY: dict[str, tuple[Callable[..., TextEnv], dict[str, Any], type | None]] = {}


def register(name: str, factory: Callable[..., TextEnv], options_cls: type | None = None, **preset: Any) -> None:
    """Register `factory` under `name`; `options_cls` is its options dataclass
    (checked by `make`), `preset` the options this name fixes."""
    _REGISTRY[name] = (factory, preset, options_cls)


_PREFIXES: dict[str, tuple[Callable[..., TextEnv], tuple[str, ...]]] = {}


def register_prefix(prefix: str, factory: Callable[..., TextEnv], listed: tuple[str, ...] = ()) -> None:
    """Names ``<prefix><id>`` make ``factory(id, **options)`` (which checks its own
    options, raising `EnvError`); `listed` are the ids `names()` shows."""
    _PREFIXES[prefix] = (factory, listed)


def names() -> list[str]:
    """Registered environment names (and the listed ids of each prefix)."""
    return sorted([*_REGISTRY, *(p + i for p, (_, listed) in _PREFIXES.items() for i in listed)])


def make(name: str, **options: Any) -> TextEnv:
    """A new environment; unknown names and options raise `EnvError`."""
    for prefix, (make_one, _) in _PREFIXES.items():
        if name.startswith(prefix) and name not in _REGISTRY:
            env = make_one(name[len(prefix) :], **options)
            env.name = name
            return env
    if name not in _REGISTRY:
        raise EnvError(f"unknown environment '{name}'{did_you_mean(name, names())}")
    factory, preset, options_cls = _REGISTRY[name]
    merged = {**preset, **options}
    if options_cls is not None:
        fields = [f.name for f in dataclasses.fields(options_cls)]
        for key in merged:
            if key not in fields:
                raise EnvError(f"environment '{name}': unknown option '{key}'{did_you_mean(key, fields)}")
        try:
            opts = options_cls(**merged)
        except (TypeError, ValueError) as exc:
            raise EnvError(f"environment '{name}': {exc}") from None
        env = factory(opts)
    else:
        env = factory(**merged)
    env.name = name
    return env


def data_digest(name: str, options: dict[str, Any] | None) -> str | None:
    """The content hash of the data an environment reads from files the options name
    (its options class's ``data_digest()``: `envs.records`), for the result keys of the
    stages that play it; None for an environment that reads none, or options that are
    not valid (`make` says why)."""
    entry = _REGISTRY.get(name)
    if entry is None or entry[2] is None or not hasattr(entry[2], "data_digest"):
        return None
    try:
        opts = entry[2](**{**entry[1], **(options or {})})
    except (TypeError, ValueError):
        return None
    digest = opts.data_digest()
    return str(digest) if digest is not None else None
