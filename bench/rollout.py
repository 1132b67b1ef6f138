"""Rollout throughput: sampled tokens/s of the rollout stage against a bare
in-process ``model.generate`` loop on the same model, prompts and batch.

The relative-view preset (`configs/starpo-relative.yaml`: FrozenLake, one prompt per turn)
with its rollout alone (warm start cached beforehand, not timed). The in-process
stage (``actors: 0``) runs once while its engine records every batch of prompts it
is sent; the bare loop then replays those batches with plain transformers
``generate`` (same sampling settings, no environments, no Arrow, no commit).

Each runs ``--iterations`` iterations of new initial states; the first includes
building the engine, the later ones reuse it, and each is compared with the bare
loop on the same batches. With ``--ray`` the same iterations (the same initial
states, hence the same tokens) also run through Ray Data on one engine actor
(``actors: 1``, what the default run does) in one run, the first iteration
starting the actor; the run's engine builds are counted (target: 1 per actor).
Target: Ray Data stage / bare >= 0.9 for the kept-engine iterations. The stage's engine
encodes the instructions every prompt shares once (`stages/engines/hf.py`), which the bare
loop does not; so the stages are also compared with the stage's own engine replaying
the same batches, which leaves the cost of everything around generate.

With ``--engine both`` (or ``vllm``) new initial states are also played with
``engine: vllm``, twice: the first includes building the engine, the second
reloads new weights into the kept engine (compared with the bare loop's first
iteration).

    python bench/rollout.py [--groups 16] [--group-size 8] [--ray] [--iterations 5] [--engine hf|vllm|both]
                            [--repeats 3] [--catalog DIR]

Each measurement is repeated ``--repeats`` times on new initial states; every row
prints the median tokens/s and the min / median / max of its ratio to the bare loop.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from catalog.store import Catalog
from pipelines.graph.load import load_spec
from pipelines.run.runner import Runner
from stages.engines.hf import HFEngine, left_pad

RECORDED: list[tuple[list[list[int]], object]] = []


def _recording(generate):
    def wrapper(self, prompts, params):
        RECORDED.append(([list(p) for p in prompts], params))
        return generate(self, prompts, params)

    return wrapper


SPEC = """
extends: starpo-relative.yaml
run: {name: bench-rollout}
pipeline:   # the default run's model, warm start and rollout; the rollout always plays the warm start
  eval_start: null
  mutual_info: null
  filter: null
  advantage: null
  update: null
  eval: null
  rollout: {stage: rollout, inputs: {policy: policy}}
"""


def run_stage(
    catalog: Catalog, spec: str, overrides: list[str], iterations: int = 1
) -> list[tuple[float, float, float]]:
    """Run the rollout spec; (seconds, sampled tokens, engine builds) of each rollout step."""
    runner = Runner(load_spec(spec, [f"run.iterations={iterations}", *overrides]), catalog)
    runner.run()
    out = []
    for step in runner.steps:
        if step.node.name == "rollout":
            m = catalog.manifest(step.key)["metrics"]
            out.append((m["perf/seconds"], m["rollout/sampled_tokens"], m.get("perf/engine_builds", 0)))
    return out


@torch.no_grad()
def bare(policy: Path, batches: list[tuple[list[list[int]], object]]) -> tuple[float, int]:
    """Replay recorded batches with plain generate; (seconds, sampled tokens)."""
    engine = HFEngine(policy, prefix_cache=False)
    model, tok = engine.model, engine.tokenizer
    seconds, tokens = 0.0, 0
    for prompts, params in batches:
        ids, mask = left_pad(prompts, tok.pad_token_id)
        width = ids.shape[1]
        torch.manual_seed(params.seed)
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=params.temperature,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        seconds += time.perf_counter() - t0
        for row in out[:, width:].tolist():
            tokens += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
    return seconds, tokens


def engine_loop(policy: Path, batches: list[tuple[list[list[int]], object]], skip: int = 0) -> tuple[float, int]:
    """Replay recorded batches through the stage's own engine (its prefix caches on, as
    in the stage); (seconds inside generate, sampled tokens). The stage against this is
    the cost of everything around generate: the agent loop, Arrow, Ray Data, the actor."""
    engine = HFEngine(policy)
    seconds, tokens = 0.0, 0
    for i, (prompts, params) in enumerate(batches):
        t0 = time.perf_counter()
        out = engine.generate(prompts, params)  # type: ignore[arg-type]
        if i >= skip:  # the first iteration's batches run, untimed, as the stage's did before
            seconds += time.perf_counter() - t0
            tokens += sum(len(c.token_ids) for c in out)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--ray", action="store_true", help="also time the Ray Data path (one engine actor)")
    parser.add_argument("--iterations", type=int, default=5, help="iterations of each run")
    parser.add_argument(
        "--engine",
        choices=("hf", "vllm", "both"),
        default="hf",
        help="vllm / both: also time the stage with the vLLM engine (hf stays the reference)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats on new initial states (spread)")
    parser.add_argument("--catalog", default=None, help="catalog to keep the warm start in (default: a temp dir)")
    args = parser.parse_args()
    catalog = Catalog(args.catalog or tempfile.mkdtemp(prefix="bench-rollout-"))
    spec = str(Path(tempfile.mkdtemp(prefix="bench-rollout-spec-")) / "rollout.yaml")
    Path(spec).write_text(SPEC)
    n = args.iterations
    size = [f"rollout.n_groups={args.groups}", f"rollout.group_size={args.group_size}"]
    print("warm start (cached in the catalog, not timed) ...", flush=True)
    Runner(load_spec(spec, ["run.iterations=0"]), catalog).run()
    HFEngine.generate = _recording(HFEngine.generate)  # type: ignore[method-assign]
    repeats: list[list[tuple[str, float, float, float]]] = []
    for r in range(args.repeats):
        repeats.append(measure(catalog, spec, size, n, args, offset=int(time.time()) * 1000 + 100 * r))
        print(f"repeat {r + 1} of {args.repeats} done", flush=True)
    print(
        f"\n{args.groups} groups x {args.group_size}, {n} iterations, {args.repeats} repeats, "
        f"{torch.get_num_threads()} torch threads; tokens/s and its ratio to the bare loop on the same batches"
    )
    print(f"{'':<42}{'tokens/s (median)':>18}{'vs bare: min':>14}{'median':>8}{'max':>7}")
    for k, (name, *_rest) in enumerate(repeats[0]):
        ratios = sorted(rep[k][3] for rep in repeats)
        rates = sorted(rep[k][1] / rep[k][2] for rep in repeats)
        mid = len(ratios) // 2
        print(f"{name:<42}{rates[mid]:>18,.0f}{ratios[0]:>14.2f}{ratios[mid]:>8.2f}{ratios[-1]:>7.2f}")
    later = [k for k, row in enumerate(repeats[0]) if "iterations 2-" in row[0] and "bare" not in row[0]]
    if later:
        print(
            "\nagainst the stage's own engine replaying the same batches (its prefix caches on: what is left is "
            "the cost of the agent loop, Arrow, Ray Data and the actor); median tokens/s of that loop "
            f"{sorted(ENGINE)[len(ENGINE) // 2]:,.0f}"
        )
        for k in later:
            ratios = sorted((rep[k][1] / rep[k][2]) / e for rep, e in zip(repeats, ENGINE, strict=True))
            print(f"{repeats[0][k][0]:<42}{'':>18}{ratios[0]:>14.2f}{ratios[len(ratios) // 2]:>8.2f}{ratios[-1]:>7.2f}")
    if args.ray:
        print(f"engine builds per Ray Data run: {', '.join(str(b) for b in BUILDS)} (1 actor)")
        print(f"\nCPU by process during the first Ray Data run ({n} iterations, Ray's start included):")
        print(PROFILES[0])


BUILDS: list[int] = []


class Sampler:
    """Samples this process and every process it started (Ray's raylet, GCS, workers,
    the engine actor) twice a second: per process, CPU seconds used while sampled,
    niceness and threads. The profile of a Ray Data run."""

    def __init__(self) -> None:
        import threading

        import psutil

        self.me, self.seen = psutil.Process(), {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psutil

        while not self.stop.wait(0.5):
            for p in [self.me, *self.me.children(recursive=True)]:
                try:
                    with p.oneshot():
                        cpu = p.cpu_times()
                        cmd = p.cmdline()
                        name = cmd[0].split()[0] if cmd and cmd[0].startswith("ray::") else p.name()
                        name += " (this process)" if p.pid == self.me.pid else ""
                        row = self.seen.setdefault(p.pid, [name, cpu.user + cpu.system, 0.0, p.nice(), 0])
                        row[2] = cpu.user + cpu.system
                        row[4] = max(row[4], p.num_threads())
                except psutil.Error:
                    continue

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def table(self) -> str:
        rows = sorted(self.seen.values(), key=lambda r: r[1] - r[2])
        lines = [f"{'process':<40}{'CPU s':>8}{'nice':>6}{'threads':>9}"]
        for name, first, last, nice, threads in rows:
            if last - first >= 0.05:
                lines.append(f"{name[:39]:<40}{last - first:>8.1f}{nice:>6}{threads:>9}")
        return "\n".join(lines)


PROFILES: list[str] = []
ENGINE: list[float] = []  # tokens/s of the engine's own generate loop, per repeat


def measure(
    catalog: Catalog, spec: str, size: list[str], n: int, args: argparse.Namespace, offset: int
) -> list[tuple[str, float, float, float]]:
    """One repeat on new initial states: (row, tokens, seconds, ratio to the bare loop) per row."""
    RECORDED.clear()
    local, starts = [], []
    for i in range(n):  # one iteration per run, to know which recorded batches are whose
        starts.append(len(RECORDED))
        local += run_stage(catalog, spec, [*size, f"rollout.seed_offset={offset}", "rollout.actors=0"], i + 1)[i:]
    policy = next(
        Path(catalog.root.path("results", k, "policy")) for k in catalog.result_keys() if k.startswith("warmstart-")
    )
    first_bare = bare(policy, RECORDED[: starts[1] if n > 1 else len(RECORDED)])
    later_bare = bare(policy, RECORDED[starts[1] :]) if n > 1 else first_bare
    # one engine, kept, as the stage keeps it; over a copy: its own generate calls are recorded too
    own = engine_loop(policy, list(RECORDED), skip=starts[1] if n > 1 else 0)
    ENGINE.append(own[1] / own[0])
    rows = [
        ("bare generate loop: 1st iteration", first_bare[1], first_bare[0]),
        ("in-process stage: 1st (engine built)", local[0][1], local[0][0]),
    ]
    later = slice(1, None)
    if n > 1:
        rows += [
            (f"bare generate loop: iterations 2-{n}", later_bare[1], later_bare[0]),
            (
                f"in-process stage: iterations 2-{n}",
                sum(t for _, t, _ in local[later]),
                sum(s for s, _, _ in local[later]),
            ),
        ]
    if args.engine != "hf":
        for label, shift in (("vllm stage (engine built)", 1), ("vllm stage (weights loaded)", 2)):
            ((s, t, _),) = run_stage(
                catalog,
                spec,
                [*size, f"rollout.seed_offset={offset + shift}", "rollout.engine=vllm", "rollout.actors=0"],
            )
            rows.append((label, t, s))
    if args.ray:  # the same initial states: the same tokens as the in-process runs
        with Sampler() as sampler:
            steps = run_stage(catalog, spec, [*size, f"rollout.seed_offset={offset}", "rollout.actors=1"], n)
        PROFILES.append(sampler.table())
        BUILDS.append(int(sum(b for _, _, b in steps)))
        rows.append(("Ray Data, 1 actor: 1st (actor started)", steps[0][1], steps[0][0]))
        if n > 1:
            rows.append(
                (
                    f"Ray Data, 1 actor: iterations 2-{n}",
                    sum(t for _, t, _ in steps[later]),
                    sum(s for s, _, _ in steps[later]),
                )
            )
    out = []
    for name, tokens, seconds in rows:
        base = first_bare if "1st" in name or "vllm" in name or n == 1 else later_bare
        out.append((name, tokens, seconds, (tokens / seconds) / (base[1] / base[0])))
    return out


if __name__ == "__main__":
    main()
