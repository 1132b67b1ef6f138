"""Key derivation: stable, and sensitive to exactly what determines a result."""

from __future__ import annotations

from dataclasses import dataclass

from catalog.keys import canonical_json, result_key
from common.config import param


@dataclass(frozen=True)
class Cfg:
    a: int = param(1, "a")
    b: tuple[float, ...] = param((0.5,), "b")
    cosmetic: str = param("x", "ignored", key=False)


def test_key_is_stable_and_prefixed():
    k1 = result_key("demo.pull", 1, Cfg(), {"policy": "k/policy"}, 0, 3)
    assert k1 == result_key("demo.pull", 1, Cfg(), {"policy": "k/policy"}, 0, 3)
    assert k1.startswith("demo_pull-") and len(k1.split("-")[1]) == 16


def test_key_changes_with_each_ingredient():
    base = result_key("s", 1, Cfg(), {"x": "k/x"}, 0, 0)
    variants = [
        result_key("t", 1, Cfg(), {"x": "k/x"}, 0, 0),
        result_key("s", 2, Cfg(), {"x": "k/x"}, 0, 0),
        result_key("s", 1, Cfg(a=2), {"x": "k/x"}, 0, 0),
        result_key("s", 1, Cfg(b=(0.25,)), {"x": "k/x"}, 0, 0),
        result_key("s", 1, Cfg(), {"x": "j/x"}, 0, 0),
        result_key("s", 1, Cfg(), {"x": "k/x"}, 1, 0),
        result_key("s", 1, Cfg(), {"x": "k/x"}, 0, 1),
        result_key("s", 1, Cfg(), {"x": "k/x"}, 0, None),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_key_false_fields_are_left_out():
    assert result_key("s", 1, Cfg(cosmetic="y"), {}, 0, 0) == result_key("s", 1, Cfg(), {}, 0, 0)


def test_canonical_json_sorts_keys():
    assert canonical_json({"b": 1, "a": (1, 2)}) == '{"a":[1,2],"b":1}'
