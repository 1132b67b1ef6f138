"""Memory per worker of the update under `optim.strategy: ddp` and `fsdp`: what each
rank holds of the parameters, their gradients and AdamW's two moments after one
optimiser step, for `--workers` ranks over gloo on this machine (torch.distributed, the
update's own `stages.training.sharding.distribute` and `stages.training.fit.step`), one process per
rank, in float32 as the update trains.

    python bench/fsdp.py                               # the embedded default and a tiny tied Qwen2, 2 ranks
    python bench/fsdp.py --models embedded,smollm2     # also SmolLM2-135M-Instruct (packaged; about 1 min)

Prints, per model: parameters, bytes per rank under ddp and fsdp (exact: the shards'
sizes, not a process's RSS, which also counts the libraries and activations) and their
ratio, and the peak RSS of rank 0 for both, for scale.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.recording import Recorder
from stages.training.fit import OptimConfig, step
from stages.training.sharding import distribute


def build(name: str) -> Any:
    torch.manual_seed(0)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name == "embedded":  # the default's model and tokenizer (`model.embedded`), untied head
        from stages.agent.corpus import embedded_tokenizer
        from stages.models.policy import EmbeddedModel, build_embedded

        e = EmbeddedModel()
        return build_embedded(e, 0, embedded_tokenizer(e.vocab_size))[0]
    if name == "tiny-qwen2-tied":
        cfg = Qwen2Config(
            vocab_size=1000,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
        return Qwen2ForCausalLM(cfg)
    if name == "smollm2":
        from stages.models.packaged import fetch
        from stages.models.policy import load_policy

        return load_policy(fetch("smollm2-135m-instruct"), dtype="float32")[0]
    raise SystemExit(f"error: --models: unknown model {name!r} (embedded, tiny-qwen2-tied, smollm2)")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def rank_bytes(name: str, strategy: str, rank: int, world: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("BENCH_PORT", "29561"))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    optim = OptimConfig(workers=world, strategy=strategy)
    model = distribute(build(name), optim)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids).loss.backward()
    step(model, opt, 1.0)
    params = sum(_local(p).numel() * _local(p).element_size() for p in model.parameters())
    moments = sum(
        _local(v).numel() * _local(v).element_size()
        for s in opt.state.values()
        for k, v in s.items()
        if k in ("exp_avg", "exp_avg_sq")
    )
    total = sum(p.numel() for p in build(name).parameters()) if rank == 0 else 0
    if rank == 0:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out.put((total, params, moments, rss))
    dist.destroy_process_group()


def measure(name: str, strategy: str, world: int) -> tuple[int, int, int, int]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_bytes, args=(name, strategy, r, world, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=900)
    for p in procs:
        p.join()
    return result


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="embedded,tiny-qwen2-tied")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--save", default=None, help="also write what it prints to bench/results/<SAVE>.json")
    args = ap.parse_args()
    out = Recorder()
    out.line(f"{args.workers} ranks, float32; per rank: parameters + gradients + AdamW moments, after one step")
    out.line("| model | parameters | ddp per rank | fsdp per rank | fsdp / ddp | rank-0 peak RSS ddp / fsdp |")
    out.line("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        rows = {s: measure(name, s, args.workers) for s in ("ddp", "fsdp")}
        total = rows["ddp"][0]
        held = {s: 2 * r[1] + r[2] for s, r in rows.items()}  # gradients are the size of the parameters
        out.line(
            f"| {name} | {total:,} | {gib(held['ddp'])} | {gib(held['fsdp'])} | {held['fsdp'] / held['ddp']:.3f} "
            f"| {gib(rows['ddp'][3])} / {gib(rows['fsdp'][3])} |"
        )
    if args.save:
        out.save(args.save)


if __name__ == "__main__":
    main()
