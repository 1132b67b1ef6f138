"""Rollout throughput: sampled tokens/s of the rollout stage against a bare
in-process ``model.generate`` loop on the same model, prompts and batch.

The stage runs once through the pipeline runner (warm start cached beforehand,
not timed) while its engine records every batch of prompts it was sent; the bare
loop then replays those batches with plain transformers ``generate`` (same
sampling settings, no prefix cache, no environments, no Arrow, no commit).
Target: stage / bare >= 0.85 at the default scale (8 groups x 16).

With ``--engine both`` (or ``vllm``) the same batch (same initial states) is also
played by the stage with ``engine: vllm``, twice: the first iteration includes
building the engine, the second reloads new weights into the kept engine (what
every later iteration of a run does); the last column compares with the hf stage.

    python bench/rollout.py [--groups 8] [--group-size 16] [--ray] [--engine hf|vllm|both] [--catalog DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from catalog.store import Catalog  # noqa: E402
from pipelines.runner import Runner  # noqa: E402
from pipelines.spec import load_spec  # noqa: E402
from stages.engines.hf import HFEngine, left_pad  # noqa: E402

RECORDED: list[tuple[list[list[int]], object]] = []


def _recording(generate):
    def wrapper(self, prompts, params):
        RECORDED.append(([list(p) for p in prompts], params))
        return generate(self, prompts, params)

    return wrapper


def run_stage(catalog: Catalog, overrides: list[str]) -> tuple[float, float]:
    """Run the rollout spec; (seconds, sampled tokens) of its single rollout step."""
    runner = Runner(load_spec("rollout.yaml", ["run.iterations=1", *overrides]), catalog)
    runner.run()
    step = next(s for s in runner.steps if s.node.name == "rollout")
    metrics = catalog.manifest(step.key)["metrics"]
    return metrics["perf/seconds"], metrics["rollout/sampled_tokens"]


@torch.no_grad()
def bare(policy: Path) -> tuple[float, int]:
    """Replay the recorded batches with plain generate; (seconds, sampled tokens)."""
    engine = HFEngine(policy, prefix_cache=False)
    model, tok = engine.model, engine.tokenizer
    seconds, tokens = 0.0, 0
    for prompts, params in RECORDED:
        ids, mask = left_pad(prompts, tok.pad_token_id)
        width = ids.shape[1]
        torch.manual_seed(params.seed)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=params.temperature,
                             max_new_tokens=params.max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        seconds += time.perf_counter() - t0
        for row in out[:, width:].tolist():
            tokens += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--ray", action="store_true", help="also time the Ray Data actor path")
    parser.add_argument("--engine", choices=("hf", "vllm", "both"), default="hf",
                        help="vllm / both: also time the stage with the vLLM engine (hf stays the reference)")
    parser.add_argument("--catalog", default=None, help="catalog to keep the warm start in (default: a temp dir)")
    args = parser.parse_args()
    catalog = Catalog(args.catalog or tempfile.mkdtemp(prefix="bench-rollout-"))
    size = [f"rollout.n_groups={args.groups}", f"rollout.group_size={args.group_size}", "rollout.actors=0"]
    print("warm start (cached in the catalog, not timed) ...", flush=True)
    Runner(load_spec("rollout.yaml", ["run.iterations=0"]), catalog).run()
    HFEngine.generate = _recording(HFEngine.generate)  # type: ignore[method-assign]
    offset = int(time.time())  # new initial states: a fresh result key, never a cached one
    stage_s, stage_tokens = run_stage(catalog, [*size, f"rollout.seed_offset={offset}"])
    policy = next(Path(catalog.root.path("results", k, "policy")) for k in catalog.result_keys()
                  if k.startswith("warmstart-"))
    bare_s, bare_tokens = bare(policy)
    rows = [("bare generate loop", bare_tokens, bare_s), ("rollout stage (in-process)", stage_tokens, stage_s)]
    if args.engine != "hf":
        for label, shift in (("rollout stage, vllm (engine built)", 0), ("rollout stage, vllm (weights loaded)", 2)):
            s, t = run_stage(catalog, [*size, f"rollout.seed_offset={offset + shift}", "rollout.engine=vllm"])
            rows.append((label, t, s))
    if args.ray:
        ray_s, ray_tokens = run_stage(catalog, [*size, f"rollout.seed_offset={offset + 1}", "rollout.actors=1",
                                                f"rollout.actor_cpus={torch.get_num_threads()}"])
        rows.append(("rollout stage (Ray Data, 1 actor)", ray_tokens, ray_s))
    base = bare_tokens / bare_s
    print(f"\n{args.groups} groups x {args.group_size}, {len(RECORDED)} generate calls, "
          f"{torch.get_num_threads()} torch threads")
    hf = stage_tokens / stage_s
    print(f"{'':<38}{'tokens':>9}{'seconds':>9}{'tokens/s':>10}{'vs bare':>9}{'vs hf':>7}")
    for name, tokens, seconds in rows:
        rate = tokens / seconds
        print(f"{name:<38}{tokens:>9,.0f}{seconds:>9.1f}{rate:>10,.0f}{rate / base:>9.2f}{rate / hf:>7.2f}")


if __name__ == "__main__":
    main()
