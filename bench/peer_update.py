"""The update against a peer: this project's update stage against TRL's GRPOTrainer, on
SmolLM2-135M-Instruct (the packaged real model), full fine-tuning and LoRA.

One batch is made first (not timed): the real-model preset's agent
(`configs/starpo-smollm2.yaml`: one turn per sample, the worked example in the prompt,
FrozenLake's relative view) plays `random_safe` episodes; every turn is a row (prompt
and response tokens), its old log-probabilities come from a forward pass of the model,
its advantage is one standard normal draw per episode. Then each arm runs in a fresh
process, one after another, and reports its seconds and its peak RSS:

- ``ours``: `stages.training.fit.fit(actor_loop)` as the update stage runs it (Ray Train's
  local mode, the checkpoint and the optimiser state written into the stage's output;
  ``ray.init`` is excluded, once per run). ``save_s`` is the part spent writing it.
- ``trl``: `trl.GRPOTrainer` built on the same model and settings, driven on the same
  rows: for each mini-batch, its own loss (`GRPOTrainer.compute_loss`: log-probs of
  the completion, clipped ratio, entropy bonus) and backward per micro-batch, then
  clipping and its optimizer's step. Generation is not run (the batch is given), and
  it writes no checkpoint.

Both: AdamW at the preset's learning rate, gradient clip 1.0, the preset's mini- and
micro-batch sizes, one epoch, clip 0.2 / 0.28, entropy bonus 0.001, no KL term, token-mean
loss over the mini-batch (TRL's ``dapo``), float32. LoRA: rank 8, alpha 16 on q/k/v/o
(`model.lora`'s default) on both. Tokens are every row's prompt and response tokens.
Targets (issue 45): ours at least 1.0x TRL's tokens/s at no more peak RSS.

TRL is not a dependency of the project: ``pip install -c constraints-cpu.txt -e '.[peer]'``.

    python bench/peer_update.py                    # 48 rows, about 6 minutes here
    python bench/peer_update.py --rows 96 --micro 8
    python bench/peer_update.py --arms ours-full-unshared   # ours without the shared-prefix forward

The table of a run of the four arms is written to ``bench/results/peer-update.json`` too
(``--show`` prints it).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "configs" / "starpo-smollm2.yaml"
MODEL = "smollm2-135m-instruct"
ARMS = ("ours-full", "trl-full", "ours-lora", "trl-lora")
#: not run by default: ours without the shared-prefix forward (`stages.models.forward`), to see its share
EXTRA_ARMS = ("ours-full-unshared",)
RESULT = ROOT / "bench" / "results" / "peer-update.json"


@dataclass(frozen=True)
class Settings:
    lr: float
    mini: int
    micro: int
    clip_low: float = 0.2
    clip_high: float = 0.28
    entropy: float = 0.001


def preset_agent() -> Any:
    from stages.agent.loop import AgentConfig

    # the worked example in the prompt, as measured (the preset itself dropped it for its warm start)
    return AgentConfig(**{**yaml.safe_load(PRESET.read_text())["agent"], "example": True})


def make_batch(folder: Path, rows: int, seed: int) -> None:
    """The policy (full and LoRA version 0) and the batch, under `folder`."""
    from stages.models.gguf_file import load_gguf
    from stages.models.lora import LoraSettings, recorded
    from stages.models.packaged import fetch
    from stages.models.policy import save_policy
    from stages.models.turns import fix_tokenizer
    from stages.training.sft import samples
    from stages.warmstart import WarmstartConfig, demonstrations

    model, tokenizer = load_gguf(fetch(MODEL))
    fix_tokenizer(tokenizer, model)
    save_policy(model, tokenizer, folder / "full", version=0, base=MODEL)
    save_policy(model, tokenizer, folder / "lora", version=0, base=MODEL, **recorded(LoraSettings()))
    lake = {"slippery": False, "render": "relative"}
    table: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(seed)
    episodes = 8
    while len(table) < rows:
        cfg = WarmstartConfig(
            envs=("frozenlake",),
            env_options={"frozenlake": lake},
            demonstrator="random_safe",
            episodes=episodes,
            agent=preset_agent(),
        )
        table = []
        for e in demonstrations(cfg, tokenizer, seed):
            adv = float(torch.randn((), generator=gen))
            for s in samples(e, tokenizer):
                mask = [int(x != -100) for x in s.labels]
                table.append({"token_ids": list(s.ids), "loss_mask": mask, "adv": adv})
        episodes *= 2
    table = table[:rows]
    model.eval()
    from stages.models.forward import sampled_logprobs

    for r in table:
        ids = torch.tensor([r["token_ids"]])
        mask = torch.tensor([r["loss_mask"]])
        with torch.no_grad():
            logp, _ = sampled_logprobs(model, ids, torch.ones_like(ids), mask, torch.ones(1))
        r["logprobs"] = logp[0].tolist()
        adv = r.pop("adv")
        r["advantages"] = [adv * m for m in r["loss_mask"]]
        r["temperature"] = 1.0
    pq.write_table(pa.Table.from_pylist(table), folder / "batch.parquet")


class _Ref:
    """What the update loop reads of a catalog artifact: its key and its folder."""

    def __init__(self, key: str, path: Path) -> None:
        self.key, self.path = key, path

    def local_path(self) -> Path:
        return self.path


def run_ours(folder: Path, lora: bool, s: Settings, shared: bool = True) -> dict[str, float]:
    from stages.models import forward
    from stages.training import fit as train
    from stages.training.fit import LocalContext, OptimConfig, fit
    from stages.training.loops import ActorJob, actor_loop
    from stages.update import UpdateConfig

    batch = pq.read_table(folder / "batch.parquet").drop_columns([])
    policy = _Ref("base", folder / ("lora" if lora else "full"))
    cfg = UpdateConfig(
        optim=OptimConfig(lr=s.lr, mini_batch_size=s.mini, micro_batch_size=s.micro, epochs=1),
        clip_ratio_low=s.clip_low,
        clip_ratio_high=s.clip_high,
        entropy_coef=s.entropy,
    )
    if not shared:
        forward.MIN_SHARED = 10**9
    saving = [0.0]
    report = train.report

    def timed_report(*args: Any, **kwargs: Any) -> None:
        t = time.perf_counter()
        report(*args, **kwargs)
        saving[0] += time.perf_counter() - t

    train.report = timed_report
    ctx = LocalContext("bench-peer-update")
    ctx.ray()
    with tempfile.TemporaryDirectory(dir=folder) as out:
        t0 = time.perf_counter()
        job = ActorJob(cfg=cfg, policy=policy, reference=policy, key="bench", seed=0)  # type: ignore[arg-type]
        metrics = fit(ctx, actor_loop, job, batch, cfg.optim, Path(out) / "policy")
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "save_s": saving[0], "grad_norm": metrics.get("actor/grad_norm", float("nan"))}


def _trl_inputs(rows: list[dict[str, Any]], pad: int, total_tokens: int) -> dict[str, torch.Tensor]:
    """TRL's per-step inputs: left-padded prompts, right-padded completions."""
    prompts, completions, olds, advs = [], [], [], []
    for r in rows:
        start = r["loss_mask"].index(1)
        prompts.append(r["token_ids"][:start])
        completions.append(r["token_ids"][start:])
        olds.append(r["logprobs"][start:])
        advs.append(r["advantages"][start])
    p_len, c_len = max(map(len, prompts)), max(map(len, completions))
    b = len(rows)
    prompt_ids = torch.full((b, p_len), pad, dtype=torch.long)
    prompt_mask = torch.zeros((b, p_len), dtype=torch.long)
    completion_ids = torch.full((b, c_len), pad, dtype=torch.long)
    completion_mask = torch.zeros((b, c_len), dtype=torch.long)
    old = torch.zeros((b, c_len))
    for i, (p, c, o) in enumerate(zip(prompts, completions, olds)):
        prompt_ids[i, p_len - len(p) :], prompt_mask[i, p_len - len(p) :] = torch.tensor(p), 1
        completion_ids[i, : len(c)], completion_mask[i, : len(c)] = torch.tensor(c), 1
        old[i, : len(o)] = torch.tensor(o)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advs),
        "old_per_token_logps": old,
        "num_items_in_batch": torch.tensor(float(total_tokens)),
    }


def run_trl(folder: Path, lora: bool, s: Settings) -> dict[str, float]:
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from stages.models.policy import load_policy
    from stages.training.fit import OptimConfig
    from stages.training.worker import mini_batches

    rows = pq.read_table(folder / "batch.parquet").to_pylist()
    t0 = time.perf_counter()
    model, tokenizer = load_policy(folder / "full", dtype="float32")
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    args = GRPOConfig(
        output_dir=str(folder / "trl-out"),
        per_device_train_batch_size=s.micro,
        gradient_accumulation_steps=s.mini // s.micro,
        num_generations=s.micro,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        weight_decay=0.01,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        epsilon=s.clip_low,
        epsilon_high=s.clip_high,
        entropy_coef=s.entropy,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["x"] * s.mini}),
        processing_class=tokenizer,
        peft_config=peft,
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=max(1, len(rows) // s.mini))
    trainer.current_gradient_accumulation_steps = s.mini // s.micro  # what Trainer's own loop sets
    setup = time.perf_counter() - t0
    model = trainer.model
    model.train()
    norms = []
    optim = OptimConfig(lr=s.lr, mini_batch_size=s.mini, micro_batch_size=s.micro, epochs=1)
    for part in mini_batches(len(rows), len(rows), optim, 0):  # the update stage's mini-batches
        mini = [rows[i] for i in part]
        tokens = sum(sum(r["loss_mask"]) for r in mini)
        for m in range(0, len(mini), s.micro):
            inputs = _trl_inputs(mini[m : m + s.micro], tokenizer.pad_token_id, tokens)
            loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "save_s": 0.0, "setup_s": setup, "grad_norm": sum(norms) / len(norms)}


def arm(name: str, folder: Path, s: Settings) -> dict[str, float]:
    """Run one arm in this process (a fresh one: the RSS peak is its own)."""
    kind, mode, *unshared = name.split("-")
    if kind == "ours":
        result = run_ours(folder, mode == "lora", s, shared=not unshared)
    else:
        result = run_trl(folder, mode == "lora", s)
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


def table(results: dict[str, dict[str, float]], tokens: int, rows: int) -> str:
    lines = [
        f"{MODEL}, {rows} rows, {tokens:,} tokens (prompt + response), one epoch; ratios ours / TRL",
        "",
        "| mode | ours tokens/s | TRL tokens/s | ratio | ours peak RSS | TRL peak RSS | ratio | ours: of it saving |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in ("full", "lora"):
        o, t = results.get(f"ours-{mode}"), results.get(f"trl-{mode}")
        if not o or not t:
            continue
        ours_tps, trl_tps = tokens / o["seconds"], tokens / t["seconds"]
        lines.append(
            f"| {mode} | {ours_tps:.0f} | {trl_tps:.0f} | {ours_tps / trl_tps:.2f}x | {o['peak_rss_gb']:.2f} GB "
            f"| {t['peak_rss_gb']:.2f} GB | {o['peak_rss_gb'] / t['peak_rss_gb']:.2f}x | {o['save_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--micro", type=int, default=None, help="micro-batch (default: the preset's)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS + EXTRA_ARMS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", action="store_true", help="print the last written table and exit")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm here
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    optim = yaml.safe_load(PRESET.read_text())["update"]["optim"]
    s = Settings(lr=optim["lr"], mini=optim["mini_batch_size"], micro=args.micro or optim["micro_batch_size"])
    if args.arm:
        print(json.dumps(arm(args.arm, Path(args.folder), s)))
        return
    if args.show:
        saved = json.loads(RESULT.read_text())
        print(table(saved["arms"], saved["tokens"], saved["rows"]))
        return
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        folder = Path(tmp)
        print(f"making the batch: {args.rows} rows (not timed) ...", flush=True)
        make_batch(folder, args.rows, args.seed)
        tokens = sum(len(x) for x in pq.read_table(folder / "batch.parquet")["token_ids"].to_pylist())
        results: dict[str, dict[str, float]] = {}
        for name in args.arms:
            cmd = [sys.executable, __file__, "--arm", name, "--folder", str(folder), "--rows", str(args.rows)]
            if args.micro:
                cmd += ["--micro", str(args.micro)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            r = results[name]
            print(
                f"  {name}: {r['seconds']:.1f} s, {tokens / r['seconds']:.0f} tokens/s, "
                f"peak RSS {r['peak_rss_gb']:.2f} GB, grad norm {r['grad_norm']:.3f}",
                flush=True,
            )
    print(table(results, tokens, args.rows))
    if set(results) != set(ARMS):  # a partial run prints, and leaves the table of the last full one
        return
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"rows": args.rows, "tokens": tokens, "micro": s.micro, "arms": results}, indent=1))


if __name__ == "__main__":
    main()
