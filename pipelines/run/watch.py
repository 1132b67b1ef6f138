"""Early warnings of collapse, checked after every iteration of a run.

The paper's Echo Trap (docs/method.md#what-we-measure): the in-group reward std and the policy entropy fall
*before* the reward does, responses converge to one template, and gradient-norm
spikes mark the collapse. The opposite failure, an entropy that runs away (e.g. too
large an entropy bonus), shows as answers that grow long and then break the format:
`length_spike` and `format_drop` watch for it. Each rule below watches one metric of
the `metrics` view against its own recent past:

- ``drop``: the value is below (1 - threshold) x the mean of the trailing `window`;
- ``spike``: the value is above threshold x the median of all earlier values;
- ``above``: the value crosses above the absolute threshold.

``reward_collapse`` is a ``drop`` of the in-group reward std that counts only while rollout
success is below its best so far (by ``collapse_margin``): on a task whose right answer is one
answer, the groups stop varying both when the policy settles on the right answer (success at
its best: sharpening) and when it settles on a worse one (the Echo Trap's fall). It tells them
apart by itself, so the template diagnostic does not quiet it: on the real-model bandit it fired
at iterations 3, 4 and 4 of vanilla StarPO's three seeds, before the rollout success fell (at 4,
6 and never by 20 points), and never on StarPO-S (docs/history.md#warnings-before-the-fall;
tests/pipelines/run/test_watch.py replays those runs).

The entropy, duplicate, diversity and reward-std rules, and a single spike of the
gradient norm, stay quiet while the template-collapse diagnostic (the `mutual_info` stage, `stages.rl.mutual_info`) says the
responses still depend on the prompt: a policy that answers each state with one confident
word is sure of itself (low entropy), repeats itself, and its groups all score alike,
because it is sharp, not because it collapsed; and one mini-batch with a rare large
advantage spikes its gradient once. A gradient norm that stays up (the mean of three
updates, `grad_norm_surge`) is warned of whatever the diagnostic says.
Once the diagnostic has reported (it runs on iteration 0 of every run that has it), they
also wait until it has reported `SHARPENING_SMOOTH` times: one estimate on 16 pairs
scatters too much to tell either way. Without that stage in the pipeline they fire as
before.

A rule fires when its condition becomes true (not again while it stays true), once
`min_history` earlier values exist. The runner prints each warning live and keeps it
in ``runs/<run>/events.parquet`` (the `events` view). The spec's ``warnings:``
section sets the thresholds; a threshold of null turns its rule off, ``enabled:
false`` all of them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipelines.run.hooks import Event, Hooks
from pipelines.spec.rules import RULES, SHARPENING_METRIC, SHARPENING_SMOOTH, Kind, WarningsSection


def _condition(
    kind: Kind, value: float, history: list[float], threshold: float, window: int, floor: float = 0.0
) -> float | None:
    """The reference value if the condition holds, else None."""
    if kind == "drop":
        ref = statistics.fmean(history[-window:])
        return ref if ref > floor and value < (1 - threshold) * ref else None
    if kind == "spike":
        ref = statistics.median(history)
        return ref if ref > 0 and value > threshold * ref else None
    return threshold if value > threshold else None


@dataclass
class Watcher:
    """Feeds each iteration's metrics through the rules and returns the new events."""

    cfg: WarningsSection
    history: dict[str, list[float]] = field(default_factory=dict)
    firing: set[str] = field(default_factory=set)
    dependence: list[float] = field(default_factory=list)  # the SHARPENING_METRIC values seen

    def _dependence(self) -> float | None:
        return statistics.fmean(self.dependence[-SHARPENING_SMOOTH:]) if self.dependence else None

    def sharpening(self) -> bool:
        """Whether the latest diagnostics say the responses still depend on the prompt."""
        bar, seen = self.cfg.sharpening_mi, self._dependence()
        return bar is not None and seen is not None and seen >= bar

    def quieted(self) -> bool:
        """Whether the rules that sharpening quiets must stay quiet now: the diagnostic says
        sharpening, or it has reported but fewer than `SHARPENING_SMOOTH` times."""
        if self.cfg.sharpening_mi is None:
            return False
        return self.sharpening() or 0 < len(self.dependence) < SHARPENING_SMOOTH

    def independent(self) -> bool:
        """Whether the latest diagnostics say the responses ignore the prompt."""
        bar, seen = self.cfg.sharpening_mi, self._dependence()
        return seen is not None and seen < (bar if bar is not None else 0.1)

    def _below_best(self, metric: str, metrics: dict[str, float]) -> bool:
        """Whether `metric` is now below its best so far by ``collapse_margin``, each a
        mean of ``collapse_smooth`` iterations."""
        now, seen = metrics.get(metric), self.history.get(metric, [])
        if now is None:
            return False
        k = self.cfg.collapse_smooth
        series = [*seen, now]
        means = [statistics.fmean(series[i - k + 1 : i + 1]) for i in range(k - 1, len(series))]
        return len(means) > 1 and means[-1] < max(means[:-1]) - self.cfg.collapse_margin

    def observe(self, iteration: int, metrics: dict[str, float]) -> list[Event]:
        events = []
        if SHARPENING_METRIC in metrics:
            self.dependence.append(metrics[SHARPENING_METRIC])
        for rule in RULES:
            threshold = getattr(self.cfg, rule.field)
            value = metrics.get(rule.metric)
            if not self.cfg.enabled or threshold is None or value is None:
                continue
            past = self.history.setdefault(rule.metric, [])
            recent = [*past, value][-rule.smooth :]
            before = past[: len(past) - (len(recent) - 1)]
            shown = statistics.fmean(recent)
            ref = (
                _condition(rule.kind, shown, before, threshold, self.cfg.window, rule.floor)
                if len(before) >= self.cfg.min_history
                else None
            )
            if ref is not None and rule.sharpening_quiets and self.quieted():
                ref = None
            if ref is not None and rule.needs_no_dependence and not self.independent():
                ref = None
            if ref is not None and rule.below_best is not None and not self._below_best(rule.below_best, metrics):
                ref = None
            if ref is not None and rule.name not in self.firing:
                events.append(
                    Event(
                        iteration,
                        rule.name,
                        rule.metric,
                        shown,
                        ref,
                        threshold,
                        f"{rule.what}: {rule.metric} = {shown:.4g} vs {ref:.4g}"
                        + (f" (mean of the last {rule.smooth})" if rule.smooth > 1 else ""),
                    )
                )
            (self.firing.add if ref is not None else self.firing.discard)(rule.name)
        watched = {rule.metric for rule in RULES} | {rule.below_best for rule in RULES if rule.below_best}
        for metric in watched:  # once each, though several rules may watch one metric
            if self.cfg.enabled and metrics.get(metric) is not None:
                self.history.setdefault(metric, []).append(metrics[metric])
        return events


class WarningHooks(Hooks):
    """Checks the rules after every iteration and hands each new event to `notify`
    (the runner passes it on to every hook's `on_warning`)."""

    def __init__(self, cfg: WarningsSection, notify: Callable[[Event], None]) -> None:
        self.watcher, self.notify = Watcher(cfg), notify

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        for event in self.watcher.observe(iteration, dict(metrics)):
            self.notify(event)


def replay(by_iteration: dict[int, dict[str, float]], cfg: WarningsSection) -> list[tuple[int, str]]:
    """The (iteration, rule) of every warning a run's stored metrics (by iteration) fire
    under `cfg`, as the run would have fired them."""
    watcher = Watcher(cfg)
    return [(e.iteration, e.rule) for i in sorted(by_iteration) for e in watcher.observe(i, by_iteration[i])]


def first_fall(success: list[float], by: float = 0.2, window: int = 3) -> int | None:
    """The index of the first iteration where the mean success of the last `window`
    iterations is `by` below the best such mean before it: a fall, from the rollouts alone
    (a rollout of 32 episodes moves by about 0.09 from noise alone; the mean of three, by
    about 0.05)."""
    best = None
    for i in range(window - 1, len(success)):
        mean = statistics.fmean(success[i - window + 1 : i + 1])
        if best is not None and mean <= best - by:
            return i
        best = mean if best is None else max(best, mean)
    return None
