"""LoRA against full fine-tuning: trainable parameters, update tokens/s, peak memory.

Each mode runs in its own process (so its peak resident memory is its own): it
builds the same embedded model (seeded), then trains on the same synthetic batch
with the update's own pieces: `stages.models.forward.sampled_logprobs`, the PPO
loss (`stages.rl.losses`), AdamW over the trainable parameters (`stages.training.fit
.optimizer`), gradient clipping and a step per mini-batch. ``lora`` wraps the model
with `stages.models.lora.attach` (rank --rank on q/k/v/o).

Reported per mode: trainable and total parameters, tokens/s over --steps steps
(after one untimed step), and the process's peak RSS (``ru_maxrss``, which includes
the Python and torch runtime, the same in both). Ratios are lora / full.

    python bench/lora.py [--size small|medium] [--rank 8] [--steps 5] [--batch 16] [--length 256]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = {
    "small": {"hidden_size": 128, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate_size": 384},  # the default
    "medium": {"hidden_size": 512, "layers": 8, "heads": 8, "kv_heads": 4, "intermediate_size": 1536},
}


def run_mode(mode: str, size: str, rank: int, steps: int, batch: int, length: int) -> dict[str, float]:
    import torch

    from stages.agent.corpus import embedded_model
    from stages.models import lora
    from stages.models.forward import sampled_logprobs
    from stages.models.policy import EmbeddedModel
    from stages.rl import losses
    from stages.training.fit import OptimConfig, optimizer

    torch.set_num_threads(2)
    model, _ = embedded_model(EmbeddedModel(**SIZES[size]), seed=0)
    if mode == "lora":
        with tempfile.TemporaryDirectory() as empty:
            settings = {
                "r": rank,
                "alpha": 2.0 * rank,
                "dropout": 0.0,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            }
            model = lora.attach(model, Path(empty), settings)
    model.train()
    trainable, total = lora.trainable(model)
    opt = optimizer(model, OptimConfig(lr=1e-4, keep_optimizer=False), Path("/nonexistent"))
    g = torch.Generator().manual_seed(0)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    attention = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, length // 2 :] = 1  # the second half "sampled"
    old = torch.full(ids.shape, -7.0)
    adv = torch.randn(ids.shape, generator=g)
    temperature = torch.ones(batch)

    def one_step() -> None:
        logp, entropy = sampled_logprobs(model, ids, attention, mask, temperature)
        terms = losses.ppo_policy_loss(logp, old, adv, 0.2, 0.28, 3.0)
        loss = losses.aggregate(terms.loss - 0.001 * entropy, mask, "token-mean", float(mask.sum()), float(batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    one_step()  # warm-up: allocations, the optimiser's state
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    seconds = time.perf_counter() - t0
    return {
        "trainable": trainable,
        "total": total,
        "tokens_per_s": steps * batch * length / seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)  # one child's mode
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.size, args.rank, args.steps, args.batch, args.length)))
        return
    results = {}
    for mode in ("full", "lora"):
        out = subprocess.run(
            [sys.executable, __file__, "--mode", mode, *sys.argv[1:]], capture_output=True, text=True, check=True
        )
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"embedded model '{args.size}', batch {args.batch} x {args.length} tokens, LoRA rank {args.rank} on q/k/v/o")
    print(f"{'':<12}{'trainable':>14}{'total':>14}{'tokens/s':>12}{'peak RSS MiB':>14}")
    for mode, r in results.items():
        print(f"{mode:<12}{r['trainable']:>14,}{r['total']:>14,}{r['tokens_per_s']:>12,.0f}{r['peak_rss_mib']:>14,.0f}")
    full, lo = results["full"], results["lora"]
    print(
        f"{'lora / full':<12}{lo['trainable'] / full['trainable']:>14.4f}{'':>14}"
        f"{lo['tokens_per_s'] / full['tokens_per_s']:>12.2f}{lo['peak_rss_mib'] / full['peak_rss_mib']:>14.2f}"
    )


if __name__ == "__main__":
    main()
