"""Supervised fine-tuning on episodes' loss-mask tokens (the warm start's training)."""

from __future__ import annotations

import random
from typing import Any

import torch

from stages.agent import Episode


def sft_batch(episodes: list[Episode], pad: int, all_tokens: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 off the loss mask, or only
    on padding with `all_tokens`)."""
    width = max(len(e.ids) for e in episodes)
    ids = torch.full((len(episodes), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, e in enumerate(episodes):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        attn[i, :n] = 1
        keep = torch.ones(n, dtype=torch.bool) if all_tokens else torch.tensor(e.mask, dtype=torch.bool)
        labels[i, :n] = torch.where(keep, ids[i, :n], -100)
    return ids, attn, labels


def fine_tune(model: Any, episodes: list[Episode], epochs: int, batch_size: int, lr: float,
              weight_decay: float, pad: int, seed: int, all_tokens: bool = False) -> list[float]:
    """Supervised epochs over the episodes' loss-mask tokens, or every token with
    `all_tokens` (AdamW, gradient clipping at 1, a short warm-up then linear decay
    to 10% of `lr`); the mean loss of each epoch."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * -(-len(episodes) // batch_size)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 1.0 - 0.9 * max(0, s - warmup) / max(1, steps - warmup)))
    rng = random.Random(f"sft:{seed}")
    model.train()
    losses = []
    for _ in range(epochs):
        order = list(episodes)
        rng.shuffle(order)
        total = 0.0
        for start in range(0, len(order), batch_size):
            ids, attn, labels = sft_batch(order[start:start + batch_size], pad, all_tokens)
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach())
        losses.append(total / max(1, -(-len(order) // batch_size)))
    model.eval()
    return losses
