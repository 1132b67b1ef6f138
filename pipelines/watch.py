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
from typing import Literal

from common.config import param
from pipelines.hooks import Event, Hooks

Kind = Literal["drop", "spike", "above"]


@dataclass(frozen=True)
class WarningsSection:
    """`warnings:` — the early-warning rules (see `pipelines.watch`)."""

    enabled: bool = param(True, "check the rules after every iteration", key=False)
    window: int = param(5, "iterations in the trailing window a drop is measured against", ge=1, key=False)
    min_history: int = param(3, "earlier values a rule needs before it may fire", ge=1, key=False)
    std_drop: float | None = param(
        0.5, "in-group reward std (rollout/in_group_std) falls by this fraction", gt=0, le=1, key=False
    )
    entropy_drop: float | None = param(
        0.5, "policy entropy (actor/entropy) falls by this fraction", gt=0, le=1, key=False
    )
    diversity_drop: float | None = param(
        0.3, "distinct bigrams of the batch (collapse/distinct2_batch) fall by this fraction", gt=0, le=1, key=False
    )
    duplicate_rise: float | None = param(
        0.5,
        "duplicate responses in the batch (collapse/duplicate_rate_batch) rise above this rate",
        gt=0,
        le=1,
        key=False,
    )
    grad_spike: float | None = param(
        5.0, "actor gradient norm (actor/grad_norm) exceeds this multiple of its running median", gt=1, key=False
    )
    length_spike: float | None = param(
        2.0,
        "mean response length (rollout/response_tokens_mean) exceeds this multiple of its running median: "
        "the answers run on, which came before the format broke in the entropy-bonus collapse",
        gt=1,
        key=False,
    )
    format_drop: float | None = param(
        0.2,
        "format-valid rate of the rollout (rollout/format_valid_rate) falls by this fraction",
        gt=0,
        le=1,
        key=False,
    )
    template_drop: float | None = param(
        0.5,
        "mutual information between prompts and responses (template/mi, the mutual_info stage) falls by "
        "this fraction: the responses stop depending on the state",
        gt=0,
        le=1,
        key=False,
    )
    sharpening_mi: float | None = param(
        0.1,
        "the entropy, duplicate, diversity and reward-std rules stay quiet while template/mi, averaged over its last 3 values, is "
        "at least this many nats (the responses still depend on the state: sharpening, not collapse); "
        "template_collapse fires only below it; null: those rules are never quieted",
        gt=0,
        key=False,
    )


@dataclass(frozen=True)
class Rule:
    """One watched metric: `field` of `WarningsSection` holds its threshold."""

    name: str
    metric: str
    kind: Kind
    field: str
    what: str
    sharpening_quiets: bool = False  # quiet while the responses still tell their prompts apart
    floor: float = 0.0  # a drop is measured only against a trailing mean above this
    smooth: int = 1  # the value is the mean of the last `smooth` values (a noisy estimate)
    needs_no_dependence: bool = False  # fires only while the MI is below the sharpening bar


RULES = (
    Rule("reward_std_drop", "rollout/in_group_std", "drop", "std_drop", "in-group reward std fell", True),
    Rule("entropy_drop", "actor/entropy", "drop", "entropy_drop", "policy entropy fell", True),
    Rule("diversity_drop", "collapse/distinct2_batch", "drop", "diversity_drop", "response diversity fell", True),
    Rule(
        "duplicate_rise", "collapse/duplicate_rate_batch", "above", "duplicate_rise", "duplicate responses rose", True
    ),
    Rule(
        "grad_norm_spike",
        "actor/grad_norm",
        "spike",
        "grad_spike",
        "actor gradient norm spiked",
        True,  # one update's spike in a policy that still reads the state: a mini-batch with a rare large advantage
    ),
    Rule(
        "grad_norm_surge",
        "actor/grad_norm",
        "spike",
        "grad_spike",
        "actor gradient norm stayed up",
        smooth=3,  # the mean of 3 updates: whatever the diagnostic says, a norm that stays up marks the instability
    ),
    Rule("length_spike", "rollout/response_tokens_mean", "spike", "length_spike", "response length spiked"),
    Rule("format_drop", "rollout/format_valid_rate", "drop", "format_drop", "format-valid rate fell"),
    Rule(
        "template_collapse",
        "template/mi",
        "drop",
        "template_drop",
        "responses stopped depending on the state (template collapse)",
        floor=0.1,  # nats: below it there was no dependence to lose (a fresh policy's MI is ~0.001)
        smooth=3,  # N = 16 pairs: one estimate scatters by about 0.17 nats on the default run
        needs_no_dependence=True,
    ),
)

#: the metric that tells sharpening from template collapse (`WarningsSection.sharpening_mi`),
#: averaged over its last `SHARPENING_SMOOTH` values. Retrieval is plotted but not used: with one-word
#: answers that many states share, a policy that reads the state retrieves at about 2x chance (count 1-4
#: of 16 on the default run), too few to tell from chance in one diagnostic.
SHARPENING_METRIC = "template/mi"
SHARPENING_SMOOTH = 3


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
        for metric in {rule.metric for rule in RULES}:  # once each, though several rules may watch one metric
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
