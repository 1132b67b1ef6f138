"""Forward passes: the policy's log-probabilities and entropies at the sampled
tokens, and the critic's values.

Alignment follows the stored trajectories: position t holds the quantity for
token t given tokens < t (computed from the hidden state at t - 1); position 0
is 0. The policy's output head is applied only at the positions that precede a
sampled token, which for a real vocabulary (Qwen: 151k) saves most of the
logits' memory and time.

Rows that share a prefix (every turn of ``agent.history: 0`` starts with the same
system prompt and instructions, most of its tokens) run that prefix through the
decoder once, as one row whose keys and values every row then attends to
(`decoder_hidden`); gradients flow back through the shared copy, so the result is
the full batch's, for less compute.
"""

from __future__ import annotations

from typing import Any

import torch

#: the shortest shared prefix run once rather than per row (tokens)
MIN_SHARED = 8


def shared_length(ids: torch.Tensor, attention: torch.Tensor) -> int:
    """How many leading tokens every row of a right-padded batch shares (real tokens
    only), leaving each row at least one token of its own."""
    if ids.shape[0] < 2:
        return 0
    real = int(attention.sum(1).min()) - 1
    same = (ids == ids[:1]).all(0) & attention.bool().all(0)
    differ = (~same[:real]).nonzero()
    return int(differ[0, 0]) if len(differ) else max(real, 0)


def decoder_hidden(model: Any, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states [B, T, H] of a right-padded batch; a prefix all
    rows share is computed once (the module docstring)."""
    decoder = model.get_decoder()
    n = shared_length(ids, attention)
    # a model that recomputes activations in training keeps no cache (transformers turns
    # use_cache off), so the prefix is not shared there: each row runs whole
    recomputes = model.training and getattr(model, "is_gradient_checkpointing", False)
    if n < MIN_SHARED or recomputes:
        return decoder(input_ids=ids, attention_mask=attention).last_hidden_state
    rows = ids.shape[0]
    head = decoder(input_ids=ids[:1, :n], use_cache=True)
    cache = head.past_key_values
    for layer in cache.layers:  # a view per row; its backward is a sum (an index's would scatter-add
        # the rows' gradients in an order that varies from run to run)
        layer.keys = layer.keys.expand(rows, *layer.keys.shape[1:])
        layer.values = layer.values.expand(rows, *layer.values.shape[1:])
    rest = decoder(input_ids=ids[:, n:], attention_mask=attention, past_key_values=cache, use_cache=True)
    return torch.cat([head.last_hidden_state.expand(rows, -1, -1), rest.last_hidden_state], dim=1)


def head_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The output head (with the model's logit soft-capping, if it has one), in float32."""
    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def sampled_logprobs(
    model: Any, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities, entropies) [B, T] of the sampled tokens under
    log_softmax(logits / temperature) (per-row temperature [B]; 0 counts as 1),
    zero off the mask."""
    hidden = decoder_hidden(model, ids, attention)
    where = mask[:, 1:].bool()
    # the temperature stays float32 (in bfloat16, 0.7 would be 0.69921875) and divides float32 logits
    temps = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    logits = head_logits(model, hidden[:, :-1][where]).float()
    logp_all = torch.log_softmax(logits / temps[:, None].expand_as(where)[where][:, None], dim=-1)
    picked = logp_all.gather(-1, ids[:, 1:][where][:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    logp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    ent = torch.zeros_like(logp)
    logp[:, 1:][where] = picked
    ent[:, 1:][where] = entropy
    return logp, ent


def values(critic: Any, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """Values [B, T] aligned with the tokens (position 0 is 0)."""
    out = critic(input_ids=ids, attention_mask=attention).logits[..., 0].float()
    return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)


#: the float32 logits one cross-scoring pass may hold (response positions x vocabulary):
#: about four tensors of that size are live at once (logits, scaled, log-softmax, its
#: exponent), so 512 MiB keeps a pass near 2 GB. Over Gemma 3's 262,144 tokens that is
#: 512 response tokens a pass; 64 sequences of 50 tokens would have been 3.3 GB each.
LOGITS_BYTES = 512 * 2**20


def tokens_per_pass(vocab: int, logits_bytes: int = LOGITS_BYTES) -> int:
    """How many scored positions' float32 logits over `vocab` tokens fit in `logits_bytes` (at least one)."""
    return max(1, logits_bytes // (4 * vocab))


def passes(lengths: list[int], micro: int, tokens: int) -> list[list[int]]:
    """Indices 0..len(lengths)-1 in order, cut into passes of at most `micro` items whose
    `lengths` sum to at most `tokens` (an item longer than that goes alone)."""
    out: list[list[int]] = []
    part: list[int] = []
    held = 0
    for k, n in enumerate(lengths):
        if part and (len(part) == micro or held + n > tokens):
            out.append(part)
            part, held = [], 0
        part.append(k)
        held += n
    return [*out, part] if part else out


def cross_logprobs(
    model: Any,
    prompts: list[tuple[int, ...]],
    responses: list[tuple[int, ...]],
    temperatures: list[float],
    micro: int = 64,
    logits_bytes: int = LOGITS_BYTES,
) -> Any:
    """``ll[i, j] = log p(responses[j] | prompts[i])`` (float64 numpy, N x N): each
    response's tokens scored after every prompt under log_softmax(logits / T_j), where
    T_j is the temperature response j was sampled at (`stages.rl.mutual_info`). A pass
    takes at most `micro` sequences, and fewer where their logits would exceed
    `logits_bytes` (`LOGITS_BYTES`)."""
    import numpy as np

    n = len(prompts)
    pairs = [(i, j) for i in range(n) for j in range(n)]
    ll = np.zeros((n, n))
    vocab = int(model.get_output_embeddings().weight.shape[0])
    for cut in passes([len(responses[j]) for _, j in pairs], micro, tokens_per_pass(vocab, logits_bytes)):
        part = [pairs[k] for k in cut]
        seqs = [list(prompts[i]) + list(responses[j]) for i, j in part]
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(part), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, ((i, _), s) in enumerate(zip(part, seqs)):
            ids[row, : len(s)] = torch.tensor(s)
            attention[row, : len(s)] = 1
            mask[row, len(prompts[i]) : len(s)] = 1
        temps = torch.tensor([temperatures[j] for _, j in part], dtype=torch.float32)
        dev = next(model.parameters()).device  # the model's device, a GPU's where it has one
        with torch.no_grad():
            logp, _ = sampled_logprobs(model, ids.to(dev), attention.to(dev), mask.to(dev), temps.to(dev))
        for row, (i, j) in enumerate(part):
            ll[i, j] = float(logp[row].sum())
    return ll
