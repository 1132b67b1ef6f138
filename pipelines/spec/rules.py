"""The spec's `warnings:` section and the early-warning rules whose thresholds it sets;
`pipelines.run.watch` checks them after every iteration and describes each kind."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from common.config import param

Kind = Literal["drop", "spike", "above"]


@dataclass(frozen=True)
class WarningsSection:
    """`warnings:` — the early-warning rules (see `pipelines.run.watch`)."""

    enabled: bool = param(True, "check the rules after every iteration", key=False)
    window: int = param(5, "iterations in the trailing window a drop is measured against", ge=1, key=False)
    min_history: int = param(3, "earlier values a rule needs before it may fire", ge=1, key=False)
    std_drop: float | None = param(
        0.5, "in-group reward std (rollout/in_group_std) falls by this fraction", gt=0, le=1, key=False
    )
    collapse_drop: float | None = param(
        0.4,
        "in-group reward std (rollout/in_group_std) falls by this fraction while rollout success "
        "(rollout/success_rate) is below its best so far by collapse_margin: the groups stop varying because the "
        "policy settled on a worse answer, not a better one (reward_collapse; the MI diagnostic does not quiet it)",
        gt=0,
        le=1,
        key=False,
    )
    collapse_margin: float = param(
        0.1, "how far below its best so far rollout success must be for reward_collapse", gt=0, le=1, key=False
    )
    collapse_smooth: int = param(
        3,
        "iterations of rollout success reward_collapse averages, now and at its best (a rollout of 16 lakes swings "
        "by more than collapse_margin from noise alone; 1: the iteration's own, as before: "
        "experiments/warning_table.py)",
        ge=1,
        key=False,
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
    below_best: str | None = None  # fires only while this metric is below its best so far by `collapse_margin`


RULES = (
    Rule(
        "reward_collapse",
        "rollout/in_group_std",
        "drop",
        "collapse_drop",
        "in-group reward std fell while rollout success is below its best (collapse onto a worse answer)",
        below_best="rollout/success_rate",
    ),
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


def settings_given(items: list[str]) -> WarningsSection:
    """The rules with the thresholds `items` give (``field=value``; ``null``: the rule off), for
    the scripts that replay stored runs (experiments/warnings.py, experiments/warning_table.py);
    a mistake raises ValueError naming the item."""
    known = {f.name: f for f in dataclasses.fields(WarningsSection)}
    fields: dict[str, float | int | None] = {}
    for item in items:
        key, _, text = item.partition("=")
        if key not in known:
            raise ValueError(f"-s {item}: '{key}' is not a warnings field ({', '.join(sorted(known))})")
        try:
            value = None if text in ("null", "none", "None") else float(text)
        except ValueError:
            raise ValueError(f"-s {item}: expected a number or null after '='") from None
        fields[key] = int(value) if value is not None and known[key].type in (int, "int") else value
    return WarningsSection(**fields)  # type: ignore[arg-type]
