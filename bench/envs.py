"""Environment throughput on one core: resets/s and steps/s per environment, and
Sokoban rooms/s at 6x6/1 box and 8x8/2 boxes (target: >= 1,000 rooms/s at 6x6/1 box).

    python bench/envs.py [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# This file is named like the package it measures: put the repository root first.
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

import envs  # noqa: E402
from envs.sokoban_gen import generate  # noqa: E402

NAMES = ["bandit", "sokoban", "sokoban_larger", "frozenlake", "countdown"]


def rate(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(n)
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{'env':<16}{'resets/s':>12}{'steps/s':>12}")
    for name in NAMES:
        env = envs.make(name)
        resets = rate(lambda i: env.reset(i), args.seconds)
        env.reset(0)
        words = env.action_words or ("1 + 2",)

        def step(i: int) -> None:
            if env.done:
                env.reset(i)
            env.step(words[i % len(words)])

        print(f"{name:<16}{resets:>12,.0f}{rate(step, args.seconds):>12,.0f}")
    small = rate(lambda i: generate(i, 6, 6, 1, 3, 10), args.seconds)
    large = rate(lambda i: generate(i, 8, 8, 2, 3, 10), args.seconds)
    print(f"sokoban rooms/s  6x6/1 box: {small:,.0f} (target >= 1,000: {small / 1000:.1f}x)")
    print(f"sokoban rooms/s  8x8/2 boxes: {large:,.0f}")


if __name__ == "__main__":
    main()
