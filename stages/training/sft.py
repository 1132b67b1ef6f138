"""Supervised fine-tuning on demonstrations (the warm start's training).

Each demonstration episode gives one sample per prompt (one, or one per turn with a
history window; `stages.agent.loop`). The loss is the token cross-entropy on the loss-mask
tokens (or on every token with `all_tokens`) plus, optionally, `action_weight` x a
cross-entropy over the environment's *action words* at each demonstrated action
token: the softmax taken over the first tokens of the action words only. The plain
objective lets a fresh model learn the format and the actions' frequencies long
before it reads the state; the action-word term is a decision signal that does not
vanish once the format is right (experiments/warmstart.py measures both).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from stages.agent import prompts
from stages.agent.loop import Episode
from stages.models.forward import decoder_hidden, head_logits
from stages.rl.estimators import turn_spans


@dataclass(frozen=True)
class Sample:
    """One training sequence: ids, labels (-100 off the loss), its action tokens as
    (position, candidate token ids, index of the demonstrated one), and a loss weight for
    each labelled token in order (empty: every one weighs 1)."""

    ids: list[int]
    labels: list[int]
    actions: tuple[tuple[int, tuple[int, ...], int], ...] = ()
    weights: tuple[float, ...] = ()


def action_tokens(tokenizer: Any, words: tuple[str, ...]) -> list[tuple[int, ...]]:
    """The first token of every action word, as written first in an answer and after
    the separator's space; a variant whose words share a first token is left out."""
    out = []
    for lead in ("", " "):
        firsts = tuple(tokenizer.encode(lead + w, add_special_tokens=False)[0] for w in words)
        if len(set(firsts)) == len(firsts) and firsts not in out:
            out.append(firsts)
    return out


def _answer_start(ids: list[int], start: int, end: int, opening: list[int], think: bool) -> int | None:
    """Where a response's answer begins: at once without thinking (the prompt ends with
    the answer tag), else after the answer tag inside the response (None if absent)."""
    if not think:
        return start
    k = len(opening)
    return next((p + k for p in range(start, end - k + 1) if ids[p : p + k] == opening), None)


def samples(episode: Episode, tokenizer: Any, all_tokens: bool = False, actions: bool = False) -> list[Sample]:
    """The episode's training samples; with `actions`, their action-token positions."""
    variants = action_tokens(tokenizer, episode.env.action_words) if actions and episode.env.action_words else []
    opening = tokenizer.encode(prompts.ANSWER_OPEN, add_special_tokens=False)
    out, start = [], 0
    for n in episode.segments:
        ids, mask = episode.ids[start : start + n], episode.mask[start : start + n]
        start += n
        labels = [t if (m or all_tokens) else -100 for t, m in zip(ids, mask)]
        found = []
        for a, last in turn_spans(torch.tensor(mask)):
            b = last + 1
            begin = _answer_start(ids, a, b, opening, episode.cfg.think)
            for p in range(begin if begin is not None else b, b):
                firsts = next((f for f in variants if ids[p] in f), None)
                if firsts is not None and p > 0:
                    found.append((p, firsts, firsts.index(ids[p])))
        out.append(Sample(ids, labels, tuple(found)))
    return out


def sft_batch(batch: list[Sample], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 on padding)."""
    width = max(len(s.ids) for s in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, s in enumerate(batch):
        n = len(s.ids)
        ids[i, :n] = torch.tensor(s.ids)
        attn[i, :n] = 1
        labels[i, :n] = torch.tensor(s.labels)
    return ids, attn, labels


def labelled_logits(
    model: Any, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of every position that predicts a labelled token (one row each), and
    where those positions are (a mask over the batch's positions but the last)."""
    where = labels[:, 1:] != -100
    return head_logits(model, decoder_hidden(model, ids, attn)[:, :-1][where]), where


def token_weights(batch: list[Sample]) -> torch.Tensor | None:
    """The loss weight of every labelled token of the batch, in the order the labels
    are read (sample by sample, left to right); None where no sample has weights."""
    if not any(s.weights for s in batch):
        return None
    out: list[float] = []
    for s in batch:
        n = sum(1 for t in s.labels if t != -100)
        if s.weights and len(s.weights) != n:
            raise ValueError(f"a sample has {len(s.weights)} token weights for {n} labelled tokens")
        weights = list(s.weights) or [1.0] * n
        out += weights[1:] if s.labels and s.labels[0] != -100 else weights  # the first token is never predicted
    return torch.tensor(out, dtype=torch.float32)


def sft_loss(model: Any, batch: list[Sample], pad: int, action_weight: float = 0.0) -> torch.Tensor:
    """Token cross-entropy over the labels (their weighted mean where samples carry token
    weights) + `action_weight` x the action-word cross-entropy (mean over the batch's action
    tokens). The output head runs only where a labelled token is predicted (a prompt's
    positions, most of a sample, need none)."""
    dev = next(model.parameters()).device  # the model's device: a GPU's where it trains on one
    ids, attn, labels = (t.to(dev) for t in sft_batch(batch, pad))
    logits, where = labelled_logits(model, ids, attn, labels)
    weights = token_weights(batch)
    if weights is None:
        loss = F.cross_entropy(logits.float(), labels[:, 1:][where])
    else:
        weights = weights.to(dev)
        each = F.cross_entropy(logits.float(), labels[:, 1:][where], reduction="none")
        loss = (each * weights).sum() / weights.sum()
    if action_weight > 0:
        row_of = torch.full(where.shape, -1, dtype=torch.long, device=dev)  # (sample, position) -> row of `logits`
        row_of[where] = torch.arange(len(logits), device=dev)
        by_choice: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for i, s in enumerate(batch):
            for p, firsts, target in s.actions:
                by_choice.setdefault(firsts, []).append((int(row_of[i, p - 1]), target))
        terms, count = torch.zeros((), device=dev), 0
        for firsts, hits in by_choice.items():
            rows, targets = (torch.tensor(x, device=dev) for x in zip(*hits))
            if bool((rows < 0).any()):
                raise ValueError("an action token outside the labelled tokens")
            picked = logits[rows][:, list(firsts)].float()
            terms = terms + F.cross_entropy(picked, targets, reduction="sum")
            count += len(hits)
        if count:
            loss = loss + action_weight * terms / count
    return loss


def linear_decay(opt: Any, steps: int) -> Any:
    """A schedule for `steps` optimiser steps: a warm-up over the first 5%, then a linear
    decay to 10% of the optimiser's learning rate."""
    warmup = max(1, steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 1.0 - 0.9 * max(0, s - warmup) / max(1, steps - warmup))
    )


def fine_tune(
    model: Any,
    data: list[Sample],
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    pad: int,
    seed: int,
    action_weight: float = 0.0,
    on_step: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Supervised epochs over the samples (AdamW, gradient clipping at 1, a short
    warm-up then linear decay to 10% of `lr`); the mean loss of each epoch.
    `on_step(done, total)` is told after each optimiser step."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * -(-len(data) // batch_size)
    sched = linear_decay(opt, steps)
    rng = random.Random(f"sft:{seed}")
    model.train()
    losses = []
    for _ in range(epochs):
        order = list(data)
        rng.shuffle(order)
        total = 0.0
        for start in range(0, len(order), batch_size):
            loss = sft_loss(model, order[start : start + batch_size], pad, action_weight)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach())
            if on_step is not None:
                on_step(sched.last_epoch, steps)
        losses.append(total / max(1, -(-len(order) // batch_size)))
    model.eval()
    return losses
