"""Countdown (docs/method.md#environments): combine 3-4 numbers with + - * / to reach a target.

Problems are generated from the seed (the reference reads a downloaded data set):
the numbers are drawn, then a random expression over all of them fixes a reachable
target. The answer is an expression, evaluated safely (a parsed syntax tree of
numbers, the four operators and parentheses; exact fractions; never `eval`).
Reward 1 if it equals the target using each number exactly once, 0.1 if it uses
the numbers correctly but misses, else 0. An answer that is not an arithmetic
expression is an invalid action.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from envs.base import Budget, TextEnv

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class NotAnExpression(ValueError):
    pass


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """(value, numbers used) of an arithmetic expression; `NotAnExpression` otherwise."""
    if len(text) > 200:
        raise NotAnExpression("too long")
    text = text.strip().split("=")[0].replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise NotAnExpression(text) from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise NotAnExpression("division by zero")
            return OPS[type(node.op)](left, right)
        raise NotAnExpression(ast.dump(node)[:40])

    try:
        return walk(tree.body), used
    except RecursionError:
        raise NotAnExpression("too deep") from None


@dataclass(frozen=True)
class CountdownOptions:
    min_numbers: int = 3  # fewest numbers in a problem
    max_numbers: int = 4  # most numbers in a problem
    max_number: int = 30  # numbers are drawn from 1..max_number
    max_target: int = 200  # targets are reachable values in 1..max_target

    def __post_init__(self) -> None:
        if not 2 <= self.min_numbers <= self.max_numbers <= 6:
            raise ValueError("need 2 <= min_numbers <= max_numbers <= 6")


class Countdown(TextEnv):
    budget = Budget(max_turns=1, max_actions_per_traj=1, max_actions_per_turn=1)

    def __init__(self, opts: CountdownOptions) -> None:
        super().__init__()
        self.opts = opts
        self.target, self.numbers = 0, tuple[int, ...]()
        self.answer: str | None = None

    @property
    def action_words(self) -> tuple[str, ...]:
        return ()

    @property
    def example_action(self) -> str:
        return "(3 + 5) * 2"

    @property
    def instructions(self) -> str:
        return (
            "Using the given numbers, write an arithmetic expression that equals the target. "
            "Use each number exactly once, with + - * / and parentheses, e.g. (3 + 5) * 2."
        )

    def _reset(self, seed: int) -> None:
        o = self.opts
        while True:
            k = self.rng.randint(o.min_numbers, o.max_numbers)
            nums = [self.rng.randint(1, o.max_number) for _ in range(k)]
            value = random_expression_value(self.rng, nums)
            if value is not None and value.denominator == 1 and 1 <= value <= o.max_target:
                break
        self.target, self.numbers, self.answer = int(value), tuple(nums), None

    def render(self) -> str:
        text = f"Target: {self.target}, nums: [{', '.join(map(str, self.numbers))}]"
        return text if self.answer is None else f"{text}\nYour answer: {self.answer}"

    def parse_action(self, action: str) -> str | None:
        try:
            evaluate(action)
        except NotAnExpression:
            return None
        return action.strip()

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        value, used = evaluate(action)
        self.answer, self.done = action, True
        numbers_ok = Counter(used) == Counter(self.numbers)
        self.success = numbers_ok and value == self.target
        reward = 1.0 if self.success else 0.1 if numbers_ok else 0.0
        return reward, {"numbers_ok": numbers_ok, "value": float(value)}


def random_expression(rng: Any, nums: list[int]) -> str:
    """A random fully-bracketed expression using each number once."""
    items = [str(n) for n in nums]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = sorted(rng.sample(range(len(items)), 2))
        b, a = items.pop(j), items.pop(i)
        items.append(f"({a} {rng.choice('+-*/')} {b})")
    return items[0][1:-1] if items[0].startswith("(") else items[0]


def random_expression_value(rng: Any, nums: list[int]) -> Fraction | None:
    try:
        return evaluate(random_expression(rng, nums))[0]
    except NotAnExpression:
        return None


def solve(numbers: tuple[int, ...], target: int) -> str | None:
    """An expression reaching `target` with every number once, or None."""

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                options = [(a + b, f"({ea} + {eb})"), (a - b, f"({ea} - {eb})"), (a * b, f"({ea} * {eb})")]
                if b != 0:
                    options.append((a / b, f"({ea} / {eb})"))
                for value, expr in options:
                    if (found := search([*rest, (value, expr)])) is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    return found[1:-1] if found and found.startswith("(") else found
