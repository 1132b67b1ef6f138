"""One pretraining step of the default, lever by lever: milliseconds a step and a sample
against the default's own step, measured in one process.

The step is `stages.training.pretrain.train`'s (the loss over a batch of probe chats,
backward, clipping, AdamW) on the default's probe chats (one question a chat, the symbol
grid). The levers: the batches drawn and collated before the timing (what a bare PyTorch loop
over ready tensors costs: the rest is collation); one torch thread; the batch size; bfloat16 autocast (the CPU's bfloat16
matmul is printed beside float32's); `torch.compile` of the decoder (its compile time
printed apart); a 2-layer and a 64-wide model; and the turn's constant line ("You have 5
actions left. Always output: ...", after the state) moved in front of the state, where it
joins the prefix every row of a batch shares and runs once a batch (`stages.models.forward`):
the same tokens in another order, what a prompt with its varying part last would cost. What
each lever does to learning is not measured here: `experiments/pretrain.py` reads a model's
held-out answers.

    python bench/train_step.py [--steps 60] [--save train-step]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F

from common.machine import matmul_gflops
from common.recording import Recorder, run_script
from stages.agent.corpus import embedded_tokenizer
from stages.agent.loop import AgentConfig
from stages.models.forward import shared_length
from stages.models.policy import EmbeddedModel, build_embedded
from stages.training.pretrain import draw, probe_samples
from stages.training.sft import Sample, labelled_logits, sft_batch, sft_loss

#: the default's model (configs/starpo.yaml)
DEFAULT = EmbeddedModel(tie_embeddings=False, init_std=0.05)
NARROW = {"hidden_size": 64, "intermediate_size": 192, "heads": 2, "kv_heads": 1}
#: timed rounds; each takes every lever in turn, and a lever's figure is its median round
ROUNDS = 4


def stepper(
    model: Any, samples: list[Any], batch: int, pad: int, amp: bool, compiled: bool, ahead: int = 0
) -> Callable[[], None]:
    """One optimiser step a call, as the pretrain stage takes it; with `ahead`, that many
    batches are drawn and collated before the first call (a bare loop over tensors)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    if compiled:  # the decoder's forward, as the loss calls it (`get_decoder()` unwraps a compiled module)
        decoder = model.get_decoder()
        decoder.forward = torch.compile(decoder.forward, dynamic=True)
    ready = [sft_batch([samples[j] for j in draw(len(samples), batch, g)], pad) for _ in range(ahead)]

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            if ready:
                ids, attn, labels = ready.pop()
                logits, where = labelled_logits(model, ids, attn, labels)
                loss = F.cross_entropy(logits.float(), labels[:, 1:][where])
            else:
                loss = sft_loss(model, [samples[j] for j in draw(len(samples), batch, g)], pad)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


#: the line every first turn of the default shows after its state (the turn's budget and format)
CONSTANT_LINE = (
    "\nYou have 5 actions left. Always output: <answer> [your answer] </answer> with no extra text. "
    "Max response length: 48 tokens."
)


def constant_first(samples: list[Sample], tokenizer: Any) -> list[Sample]:
    """The samples with `CONSTANT_LINE`'s tokens moved from after the state to where the rows
    first differ (the end of the prefix they all share): as many tokens, the same labels."""
    line = tokenizer(CONSTANT_LINE, add_special_tokens=False)["input_ids"]
    shared = 0
    while all(len(x.ids) > shared and x.ids[shared] == samples[0].ids[shared] for x in samples):
        shared += 1
    out = []
    for x in samples:
        at = next((i for i in range(shared, len(x.ids)) if x.ids[i : i + len(line)] == line), None)
        if at is None:
            raise SystemExit(f"error: a probe chat without the line {CONSTANT_LINE!r}: the default's prompt changed")
        ids = x.ids[:shared] + line + x.ids[shared:at] + x.ids[at + len(line) :]
        labels = x.labels[:shared] + [-100] * len(line) + x.labels[shared:at] + x.labels[at + len(line) :]
        out.append(replace(x, ids=ids, labels=labels))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="timed steps a lever, in rounds (after 5 untimed)")
    ap.add_argument("--save", default="", help="write bench/results/NAME.json")
    args = ap.parse_args()
    out = Recorder()
    tokenizer = embedded_tokenizer(DEFAULT.vocab_size)
    agent = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    seeds = list(range(5 * 10**12, 5 * 10**12 + 500))
    samples = [
        s for _, s in probe_samples("frozenlake", {"slippery": False, "render": "grid"}, seeds, tokenizer, agent)
    ]
    float32, bfloat16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    out.line(f"matmul 1024 x 1024: float32 {float32:.0f} GFLOP/s, bfloat16 {bfloat16:.0f}")
    out.line(f"{torch.get_num_threads()} torch threads; {len(samples)} probe chats of the default")
    threads = torch.get_num_threads()
    moved = constant_first(samples, tokenizer)
    levers: list[tuple[str, int, dict[str, Any], bool, bool, bool, int, list[Sample]]] = [
        ("the default's step", 8, {}, False, False, False, threads, samples),
        ("batches collated ahead (a bare loop)", 8, {}, False, False, True, threads, samples),
        ("1 torch thread", 8, {}, False, False, False, 1, samples),
        ("batch 32", 32, {}, False, False, False, threads, samples),
        ("bfloat16 autocast", 8, {}, True, False, False, threads, samples),
        ("torch.compile", 8, {}, False, True, False, threads, samples),
        ("2 layers", 8, {"layers": 2}, False, False, False, threads, samples),
        ("2 layers, batch 32", 32, {"layers": 2}, False, False, False, threads, samples),
        ("64 wide", 8, NARROW, False, False, False, threads, samples),
        ("the constant line in the shared prefix", 8, {}, False, False, False, threads, moved),
        ("2 layers, the constant line in the shared prefix", 8, {"layers": 2}, False, False, False, threads, moved),
    ]
    lengths = [len(s.ids) for s in samples]
    g = torch.Generator().manual_seed(1)
    padded = [max(lengths[j] for j in draw(len(samples), 8, g)) * 8 for _ in range(200)]
    out.line(f"padding: {1 - 8 * statistics.fmean(lengths) / statistics.fmean(padded):.1%} of a batch of 8's tokens")
    for label, chats in (("as asked", samples), ("the constant line in the prefix", moved)):
        ids, attention, _ = sft_batch(chats[:8], tokenizer.pad_token_id)
        n = shared_length(ids, attention)
        row = statistics.fmean(len(c.ids) for c in chats) - n
        out.line(f"{label}: a batch of 8 shares its first {n} tokens, then {row:.1f} tokens a row")
    out.line()
    out.line(f"{ROUNDS} rounds of {max(1, args.steps // ROUNDS)} timed steps a lever, levers in turn; the median round")
    out.line("| lever | batch | ms a step | ms a sample | samples/s against the default | first 5 steps, s |")
    out.line("|---|---|---|---|---|---|")
    base = None
    data: dict[str, Any] = {}
    # every lever is built and stepped 5 times first; then the timed steps run in `ROUNDS` rounds
    # that take the levers in turn, so a slow minute of the machine falls on all of them
    runs = []
    for name, batch, sizes, amp, compiled, ahead, n_threads, chats in levers:
        torch.set_num_threads(n_threads)
        model, _ = build_embedded(replace(DEFAULT, **sizes), 0, tokenizer)
        step = stepper(model, chats, batch, tokenizer.pad_token_id, amp, compiled, 5 + args.steps if ahead else 0)
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        runs.append((name, batch, n_threads, step, time.perf_counter() - t0, []))
        torch.set_num_threads(threads)
    per_round = max(1, args.steps // ROUNDS)
    for _ in range(ROUNDS):
        for _name, _batch, n_threads, step, _setup, times in runs:
            torch.set_num_threads(n_threads)
            t0 = time.perf_counter()
            for _ in range(per_round):
                step()
            times.append((time.perf_counter() - t0) / per_round * 1000)
            torch.set_num_threads(threads)
    for name, batch, _threads, _step, setup, times in runs:
        ms = statistics.median(times)
        base = base or ms / batch
        out.line(f"| {name} | {batch} | {ms:.1f} | {ms / batch:.2f} | {base / (ms / batch):.2f}x | {setup:.1f} |")
        data[name] = {"batch": batch, "ms_step": ms, "ms_rounds": times, "setup_s": setup}
    if args.save:
        out.save(args.save, data)


if __name__ == "__main__":
    run_script(main)
