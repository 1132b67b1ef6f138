"""The template diagnostic's memory over a large vocabulary: `cross_logprobs` with its
logits budget (`stages.models.forward.LOGITS_BYTES`) against the same call unbounded
(every pass `--micro` sequences, as before the budget).

Each setting runs in its own process (its peak resident memory is its own) on the same
random model: a one-layer Llama with hidden size 64 over a vocabulary of `--vocab`
tokens (Gemma 3's 262,144 by default; the model itself is 134 MB), `--pairs` prompts of
32 tokens and responses of `--response` tokens, all cross-scored (pairs² sequences).
The logits of a pass take (sequences x response tokens x vocab x 4) bytes, and about
four tensors of that size are live at once. Reported: passes, seconds, peak RSS
(``ru_maxrss``: it includes the Python and torch runtime, the same in both), and the
largest difference between the two matrices (the budget changes how sequences are
batched, not what each scores).

    python bench/mutual_info_memory.py [--vocab 262144] [--pairs 16] [--response 16] [--micro 64]
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


def run_setting(bounded: bool, vocab: int, pairs: int, response: int, micro: int) -> dict[str, object]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.models.forward import LOGITS_BYTES, cross_logprobs, passes, tokens_per_pass

    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [tuple(torch.randint(0, vocab, (32,), generator=g).tolist()) for _ in range(pairs)]
    responses = [tuple(torch.randint(0, vocab, (response,), generator=g).tolist()) for _ in range(pairs)]
    budget = LOGITS_BYTES if bounded else 2**62
    cuts = passes([response] * pairs * pairs, micro, tokens_per_pass(vocab, budget))
    t0 = time.perf_counter()
    ll = cross_logprobs(model, prompts, responses, [1.0] * pairs, micro=micro, logits_bytes=budget)
    return {
        "passes": len(cuts),
        "seconds": time.perf_counter() - t0,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "matrix": ll.tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--response", type=int, default=16)
    ap.add_argument("--micro", type=int, default=64)
    ap.add_argument("--one", choices=["bounded", "unbounded"], help=argparse.SUPPRESS)  # a child process's setting
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_setting(args.one == "bounded", args.vocab, args.pairs, args.response, args.micro)))
        return
    sizes = ["--vocab", str(args.vocab), "--pairs", str(args.pairs), "--response", str(args.response)]
    out = {}
    for one in ("unbounded", "bounded"):
        child = [sys.executable, __file__, "--one", one, *sizes, "--micro", str(args.micro)]
        out[one] = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
    import numpy as np

    diff = float(np.abs(np.array(out["bounded"]["matrix"]) - np.array(out["unbounded"]["matrix"])).max())
    print(
        f"cross-scoring {args.pairs}^2 sequences ({args.response} response tokens) over {args.vocab:,} tokens, "
        f"micro {args.micro}"
    )
    print("| | passes | seconds | peak RSS |")
    print("|---|---|---|---|")
    for one in ("unbounded", "bounded"):
        r = out[one]
        print(f"| {one} | {r['passes']} | {r['seconds']:.1f} | {r['peak_rss_gib']:.2f} GiB |")
    ratio = out["bounded"]["peak_rss_gib"] / out["unbounded"]["peak_rss_gib"]
    print(f"peak RSS bounded / unbounded: {ratio:.2f}; largest difference between the matrices: {diff:.2e} nats")


if __name__ == "__main__":
    main()
