"""Response diversity: the collapse indicators of a rollout (docs/method.md#what-we-measure, the Echo Trap).

As a policy collapses, the responses of a group converge to one template: fewer
distinct n-grams, more exact duplicates, one response dominating the batch. The
functions here measure that on a trajectory table; the rollout reports them under
``collapse/`` every iteration, beside the in-group reward std (``rollout/``), the
entropy and the gradient norm (``actor/``), which the run's early warnings watch
(`pipelines.warnings`).

A trajectory's *response* is what the policy sampled: its tokens under the loss
mask (for distinct-n) and its turns' response texts joined (for duplicates).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa


def distinct_n(responses: Iterable[Sequence[int]], n: int) -> float:
    """Distinct n-grams / all n-grams over the responses (1.0 when there are none)."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    for r in responses:
        grams = [tuple(r[i : i + n]) for i in range(len(r) - n + 1)]
        seen.update(grams)
        total += len(grams)
    return len(seen) / total if total else 1.0


def duplicate_rate(responses: Sequence[str]) -> float:
    """Fraction of responses that repeat an earlier one exactly (0 for all distinct)."""
    return (len(responses) - len(set(responses))) / len(responses) if responses else 0.0


def top_share(responses: Sequence[str]) -> float:
    """Share of the most common response (1.0: one template everywhere)."""
    return Counter(responses).most_common(1)[0][1] / len(responses) if responses else 0.0


def sampled_tokens(table: pa.Table) -> list[list[int]]:
    """Each trajectory's sampled token ids (those under the loss mask)."""
    return [
        [t for t, m in zip(ids, mask) if m]
        for ids, mask in zip(table["token_ids"].to_pylist(), table["loss_mask"].to_pylist())
    ]


def response_texts(table: pa.Table) -> list[str]:
    """Each trajectory's responses, turn after turn, as one text."""
    return ["\x1e".join(t["response"] for t in turns) for turns in table["turns"].to_pylist()]


def collapse_metrics(table: pa.Table) -> dict[str, float]:
    """The ``collapse/`` indicators of a trajectory table (see `COLLAPSE_METRICS`)."""
    tokens, texts = sampled_tokens(table), response_texts(table)
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(table["group"].to_pylist()):
        groups.setdefault(g, []).append(row)

    def per_group(fn: Callable[[list[int]], float]) -> float:
        values = [fn(rows) for rows in groups.values()]
        return sum(values) / len(values) if values else 0.0

    return {
        "collapse/distinct1_group": per_group(lambda rows: distinct_n((tokens[r] for r in rows), 1)),
        "collapse/distinct2_group": per_group(lambda rows: distinct_n((tokens[r] for r in rows), 2)),
        "collapse/distinct2_batch": distinct_n(tokens, 2),
        "collapse/duplicate_rate_group": per_group(lambda rows: duplicate_rate([texts[r] for r in rows])),
        "collapse/duplicate_rate_batch": duplicate_rate(texts),
        "collapse/top_response_share": top_share(texts),
    }


COLLAPSE_METRICS = {
    "collapse/distinct1_group": "distinct sampled tokens / sampled tokens inside a group, mean over groups",
    "collapse/distinct2_group": "distinct sampled token bigrams / bigrams inside a group, mean over groups",
    "collapse/distinct2_batch": "distinct sampled token bigrams / bigrams over the whole batch",
    "collapse/duplicate_rate_group": "fraction of a group's responses that repeat another of the group exactly, "
    "mean over groups",
    "collapse/duplicate_rate_batch": "fraction of the batch's responses that repeat another exactly",
    "collapse/top_response_share": "share of the batch taken by its most common response (template repetition)",
}
