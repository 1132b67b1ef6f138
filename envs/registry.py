"""The environment registry: names -> environment classes with preset options.

Variants are registered names with preset options (``sokoban_larger`` is
``sokoban`` with an 8x8 room and 2 boxes); any option can also be given to `make`.
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


def names() -> list[str]:
    """Registered environment names."""
    return sorted(_REGISTRY)


def make(name: str, **options: Any) -> TextEnv:
    """A new environment; unknown names and options raise `EnvError`."""
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
