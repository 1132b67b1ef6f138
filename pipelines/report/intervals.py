"""95% intervals for what the reports and the experiments print.

- `wilson`: one success rate of k out of n episodes (one run's eval): the Wilson
  score interval, which stays inside [0, 1] and keeps its coverage near 0 and 1.
- `rate_interval`: the mean of a success rate over run seeds. Seeds, not episodes, are
  the units here, and there are few (3), so the interval is Student's t, taken on the
  logit scale and mapped back: it stays inside (0, 1) and is wider on the side away
  from the nearer bound. A t-interval on the rates themselves ran to 119.8% over three
  seeds of 67.6 / 77.0 / 30.1%, which reads as a bug and is one: no mean rate is above
  100%. A rate of 0 or 1 is moved half an episode inwards first (the logit is infinite
  there), so `episodes` says how many episodes each rate is of; rates that are all the
  same give that point.
- `mean_interval`: the mean of differences (a gain in points from one version to
  another, one per seed): Student's t on the differences themselves, which may be
  negative; it is cut to [-1, 1], what a difference of two rates can be.
"""

from __future__ import annotations

import math
import statistics

#: two-sided 95% Student t quantiles by degrees of freedom (1.96 past 30)
T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def t95(df: int) -> float:
    """The two-sided 95% Student t quantile with `df` degrees of freedom (the nearest
    tabled one at or below it; 1.96 past 30)."""
    if df > 30:
        return 1.96
    return T95[max(d for d in T95 if d <= df)]


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a success rate of `successes` out of `n`."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(xs: list[float]) -> tuple[float, float] | None:
    """The 95% Student t interval of the mean of differences `xs`, cut to [-1, 1]; None
    for fewer than two values, which have none."""
    if len(xs) < 2:
        return None
    mean, half = statistics.fmean(xs), t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return max(-1.0, mean - half), min(1.0, mean + half)


def rate_interval(rates: list[float], episodes: int) -> tuple[float, float] | None:
    """The 95% interval of the mean of success `rates` (one per seed, each of `episodes`
    episodes): Student's t on their logits, mapped back (module docstring); None for
    fewer than two rates."""
    if len(rates) < 2:
        return None
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if len(set(rates)) == 1:  # no spread over the seeds: a point, as the t-interval on the rates gives
        return rates[0], rates[0]
    edge = 0.5 / episodes
    logits = [math.log(p / (1 - p)) for p in (min(max(r, edge), 1 - edge) for r in rates)]
    mean, half = statistics.fmean(logits), t95(len(logits) - 1) * statistics.stdev(logits) / math.sqrt(len(logits))

    def back(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    return back(mean - half), back(mean + half)


def shown(bounds: tuple[float, float] | None, sign: str = "") -> str:
    """An interval in points, as the tables print it: `[lo, hi]`, or `- (one seed)`."""
    if bounds is None:
        return "- (one seed)"
    return f"[{100 * bounds[0]:{sign}.1f}, {100 * bounds[1]:{sign}.1f}]"
