"""Template collapse told apart from sharpening: how much a response depends on its
prompt (docs/method.md#template-collapse-or-sharpening).

A policy whose entropy falls may be getting good (one confident answer per state:
*sharpening*) or may have stopped reading the state (the same answer for every
state: *template collapse*). Duplicates and diversity cannot tell the two apart when
the answers are short; the mutual information I(X; Z) between prompts X and
responses Z can. On N (prompt, response) pairs with distinct prompts, the policy
scores every response under every prompt: ``ll[i, j] = log p(z_j | x_i)`` (summed
over z_j's tokens). Then

- *matched*: ``ll[j, j]``, the response under its own prompt;
- *marginal*: ``log (1/N) sum_i exp ll[i, j]``, the response under the batch's
  prompts mixed (an estimate of log p(z_j));
- *MI* (nats per response): mean over j of matched - marginal, the contrastive
  (InfoNCE) estimate, between 0 and log N; per token: each difference divided by
  z_j's length;
- *retrieval*: the share of responses whose own prompt scores them highest (ties
  shared), against chance 1/N; a sharpened policy whose answers differ by state
  retrieves well above chance, a template one at chance;
- *conditional entropy*: mean of -matched, a Monte-Carlo estimate of H(Z | X) for
  responses sampled from the policy (temperature as sampled).

Pure functions on arrays; the stage `stages.mutual_info` samples the pairs and runs
the policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def prompt_response(ids: Sequence[int], mask: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A sample's prompt (the tokens before the first sampled one) and response (the
    first run of sampled tokens: the first turn's answer); None without any."""
    m = np.asarray(mask)
    on = np.flatnonzero(m)
    if not len(on):
        return None
    a = int(on[0])
    off = np.flatnonzero(m[a:] == 0)
    b = a + int(off[0]) if len(off) else len(m)
    return tuple(ids[:a]), tuple(ids[a:b])


def distinct_prompt_rows(prompts: Sequence[tuple[int, ...]], n: int, seed: int) -> list[int]:
    """Up to `n` rows with pairwise distinct prompts, drawn at random (one row per
    distinct prompt, each prompt equally likely), in row order."""
    first: dict[tuple[int, ...], list[int]] = {}
    for row, p in enumerate(prompts):
        first.setdefault(p, []).append(row)
    rng = np.random.default_rng(seed)
    groups = list(first.values())
    picked = rng.choice(len(groups), size=min(n, len(groups)), replace=False) if groups else np.array([], int)
    return sorted(int(rng.choice(groups[int(g)])) for g in picked)


def _logmeanexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.exp(x - top).mean(axis=axis))


def cross_score_metrics(ll: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """The ``template/`` metrics of a cross-score matrix ``ll[i, j] = log p(z_j | x_i)``
    (N x N, N >= 2) and each response's length in tokens (see the module docstring)."""
    ll = np.asarray(ll, dtype=np.float64)
    n = ll.shape[0]
    if ll.shape != (n, n) or n < 2:
        raise ValueError(f"expected a square matrix of at least 2 x 2, got {ll.shape}")
    matched = np.diag(ll)
    gain = matched - _logmeanexp(ll, axis=0)
    best = ll.max(axis=0)
    ties = (ll >= best - 1e-6).sum(axis=0)
    own_is_best = matched >= best - 1e-6
    retrieval = float(np.mean(np.where(own_is_best, 1.0 / ties, 0.0)))
    length = np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)
    return {
        "template/mi": float(gain.mean()),
        "template/mi_per_token": float((gain / length).mean()),
        "template/mi_max": float(np.log(n)),
        "template/retrieval": retrieval,
        "template/retrieval_chance": 1.0 / n,
        "template/retrieval_over_chance": retrieval * n,
        "template/cond_entropy": float(-matched.mean()),
        "template/pairs": float(n),
    }


TEMPLATE_METRICS = {
    "template/mi": "mutual information between prompts and responses (nats per response; contrastive estimate: "
    "log p(own response | own prompt) minus log of its mean over the batch's prompts), 0 to log N",
    "template/mi_per_token": "the same, each response's term divided by its length in tokens",
    "template/mi_max": "log N: the largest value the estimate can take with N pairs",
    "template/retrieval": "share of responses whose own prompt scores them highest among the N prompts (ties shared)",
    "template/retrieval_chance": "1/N: retrieval of a policy whose responses ignore the prompt",
    "template/retrieval_over_chance": "retrieval / chance: 1 for a template, up to N when every response "
    "is its own prompt's",
    "template/cond_entropy": "mean -log p(response | its prompt) (nats per response): H(Z | X) for sampled responses",
    "template/pairs": "N: (prompt, response) pairs with distinct prompts that were cross-scored",
}
