"""The `hf` engine's memory for the sampled tokens' log-probs over a large vocabulary:
its sampler (`stages.engines.hf.Sampler`, one step's log-softmax kept until the next
step names the token drawn) against the bare recipe it replaced, transformers'
``generate(output_logits=True)`` and a log-softmax over the stacked logits of every
step (batch x steps x vocabulary float32).

Each setting runs in its own process (its peak resident memory is its own) on the same
random model: a one-layer Llama with hidden size 64 over `--vocab` tokens (Qwen2.5's
151,936 by default), `--rows` prompts of 16 tokens, `--steps` new tokens each (no end
token: every row runs to the end), seeded alike. Reported: seconds, peak RSS
(``ru_maxrss``: it includes the runtime, the same in both), and whether both drew the
same tokens with the same log-probs. The bare recipe's peak grows with steps x
vocabulary; the sampler's does not.

    python bench/sampling_memory.py [--vocab 151936] [--rows 32] [--steps 32,128]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_setting(arm: str, vocab: int, rows: int, steps: int) -> dict[str, object]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

    from stages.engines.hf import NEUTRAL, Sampler

    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, vocab, (rows, 16), generator=torch.Generator().manual_seed(1))
    common = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "do_sample": True, "max_new_tokens": steps}
    common.update(NEUTRAL, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    torch.manual_seed(2)
    with torch.no_grad():
        if arm == "logits":  # the bare recipe: every step's logits, then one log-softmax over them
            out = model.generate(**{**common, "temperature": 0.7}, output_logits=True)
            logits = torch.stack(out.logits, dim=1).float()
            new = out.sequences[:, ids.shape[1] :]
            logp = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, new[..., None])[..., 0]
        else:
            sampler = Sampler(ids.shape[1], 0.7, 0, 1.0)
            out = model.generate(**common, logits_processor=LogitsProcessorList([sampler]))
            new = out.sequences[:, ids.shape[1] :]
            logp = sampler.finish(out.sequences)
    return {
        "seconds": time.perf_counter() - t0,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "model_rss_gib": base / 2**20,
        "tokens": new.tolist(),
        "logprobs": logp.tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", default="32,128", help="new tokens per row, comma-separated")
    ap.add_argument("--save", default=None, help="also write what it prints to bench/results/<SAVE>.json")
    ap.add_argument("--one", choices=["logits", "sampler"], help=argparse.SUPPRESS)  # a child process's setting
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_setting(args.one, args.vocab, args.rows, int(args.steps))))
        return
    from common.recording import Recorder

    rec = Recorder()
    rec.line(f"{args.rows} rows over {args.vocab:,} tokens, T = 0.7; each setting in its own process")
    rec.line("| new tokens | bare recipe: peak RSS | sampler: peak RSS | sampler / bare | seconds (bare / sampler) |")
    rec.line("|---|---|---|---|---|")
    notes = []
    for steps in (int(s) for s in args.steps.split(",")):
        out = {}
        for arm in ("logits", "sampler"):
            child = [sys.executable, __file__, "--one", arm, "--vocab", str(args.vocab), "--rows", str(args.rows)]
            done = subprocess.run([*child, "--steps", str(steps)], check=True, capture_output=True, text=True)
            out[arm] = json.loads(done.stdout)
        bare, ours = out["logits"], out["sampler"]
        rec.line(
            f"| {steps} | {bare['peak_rss_gib']:.2f} GiB | {ours['peak_rss_gib']:.2f} GiB | "
            f"{ours['peak_rss_gib'] / bare['peak_rss_gib']:.2f} | {bare['seconds']:.1f} / {ours['seconds']:.1f} |"
        )
        same = bare["tokens"] == ours["tokens"]
        diff = max(abs(a - b) for ra, rb in zip(bare["logprobs"], ours["logprobs"]) for a, b in zip(ra, rb))
        notes.append(f"{steps} tokens: the same tokens drawn: {same}; largest log-prob difference {diff:.1e}")
    for note in notes:
        rec.line(note)
    if args.save:
        rec.save(args.save)


if __name__ == "__main__":
    main()
