"""`pipeline diff RUN_A RUN_B`: what differs between two runs of a catalog.

1. **Settings**: every typed setting whose value differs, with the file, preset or
   ``-o`` override (or default) that set it in each run. Runs record their settings
   with their sources (`pipelines.spec.explain.recorded`); for a run recorded before that,
   the keys of its resolved spec are compared and the source reads ``spec``.
2. **Steps**: how many steps the runs share in the catalog (same result key at the
   same iteration and node) and the first step, in the first run's order, where the
   keys part. Then the machines' recorded differences (`common.machine`): two runs
   that take the same keys on different kinds of machine can still differ in their
   numbers, in every step each computed itself.
3. **Curves**: per metric both runs report, the first iteration from which the two
   curves differ beyond their noise. Noise: each curve's own scatter, the robust
   standard deviation of its iteration-to-iteration changes (1.4826 x MAD / sqrt 2);
   the curves are compared on trailing means of `WINDOW` points, and they part where
   the gap exceeds `Z` standard errors of the gap for `SUSTAIN` points in a row.
   Eval success rates are binomial: their noise is sqrt(p (1 - p) / n) with n the
   eval's episodes, compared point by point (two in a row).
4. **One episode**: the same validation seed played by both runs' final policies, turn
   by turn (greedy when both evals played greedily; a seed the two policies end
   differently where there is one).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from catalog.query import query
from catalog.runs import read_record, read_steps
from catalog.store import Catalog
from common import machine
from common.errors import UserError

WINDOW = 5  # trailing points averaged before two training curves are compared
Z = 3.0  # standard errors of the gap beyond which the curves differ
SUSTAIN = 3  # points in a row (2 for eval rates)


@dataclass
class Setting:
    path: str
    a: str | None
    a_source: str
    b: str | None
    b_source: str


@dataclass
class RunDiff:
    a: str
    b: str
    settings: list[Setting]
    shared_steps: int
    steps: tuple[int, int]
    parted: tuple[int | None, str] | None  # (iteration, node) of the first step whose keys differ
    curves: list[tuple[str, int | None, str]]  # metric, first iteration beyond noise (None: never), noise used
    episode: list[str] = field(default_factory=list)  # the side-by-side lines
    # (key, a's, b's) where the runs' recorded machines differ; None: one of them is not known
    machine: list[tuple[str, Any, Any]] | None = None


def _record(catalog: Catalog, run: str) -> dict[str, Any]:
    root = catalog.root
    if not root.exists("runs", run, "run.parquet"):
        raise UserError(f"diff: no run '{run}' in {root.uri} (pipeline runs lists them)")
    return dict(read_record(root, root.path("runs", run, "run.parquet")).to_pylist()[0])


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: value}


def recorded_settings(record: dict[str, Any]) -> dict[str, dict[str, str]]:
    """path -> {value, source} of a run record (its typed settings, else its spec's keys)."""
    if record.get("settings"):  # written by this version's runner (older records lack the column)
        return dict(json.loads(record["settings"]))
    spec = yaml.safe_load(record.get("spec") or "") or {}
    return {p: {"value": json.dumps(v, default=str), "source": "spec"} for p, v in _flatten(spec).items()}


def differing_settings(a: dict[str, dict[str, str]], b: dict[str, dict[str, str]]) -> list[Setting]:
    out = []
    for path in sorted(set(a) | set(b)):
        va, vb = a.get(path, {}), b.get(path, {})
        if va.get("value") != vb.get("value"):
            out.append(Setting(path, va.get("value"), va.get("source", "-"), vb.get("value"), vb.get("source", "-")))
    return out


def robust_sd(values: np.ndarray) -> float:
    """The scatter of a curve around its trend: 1.4826 x MAD of successive changes / sqrt 2."""
    d = np.diff(values)
    if len(d) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def parting_point(
    xs: list[int], a: np.ndarray, b: np.ndarray, sd_a: float, sd_b: float, window: int, sustain: int
) -> int | None:
    """The first x from which |trailing mean of a - of b| > Z standard errors for `sustain` points."""
    se = math.sqrt(sd_a**2 + sd_b**2)
    run = 0
    for k in range(len(xs)):
        lo = max(0, k - window + 1)
        gap = abs(a[lo : k + 1].mean() - b[lo : k + 1].mean())
        bar = Z * se / math.sqrt(k + 1 - lo)
        run = run + 1 if gap > max(bar, 1e-12) else 0
        if run >= sustain:
            return xs[k - sustain + 1]
    return None


def _eval_sizes(catalog: Catalog, runs: tuple[str, str]) -> dict[tuple[str, int], int]:
    """(run, policy version) -> episodes of its eval at the sampling temperature."""
    try:
        rows = query(
            catalog,
            "select run, policy_version v, count(*)::bigint n from evals where temperature > 0 "
            f"and run in ('{_q(runs[0])}', '{_q(runs[1])}') group by all",
        ).to_pylist()
    except UserError:
        return {}
    return {(r["run"], r["v"]): r["n"] for r in rows}


def _q(text: str) -> str:
    return text.replace("'", "''")


def curves(catalog: Catalog, a: str, b: str) -> list[tuple[str, int | None, str]]:
    rows = query(
        catalog,
        f"select run, iteration, name, value from metrics where run in ('{_q(a)}', '{_q(b)}') "
        "and iteration is not null and value is not null order by name, iteration",
    ).to_pylist()
    series: dict[str, dict[str, dict[int, float]]] = {}
    for r in rows:
        series.setdefault(r["name"], {}).setdefault(r["run"], {})[r["iteration"]] = r["value"]
    sizes = _eval_sizes(catalog, (a, b))
    out = []
    for name, by_run in sorted(series.items()):
        if a not in by_run or b not in by_run or name.startswith("perf/"):
            continue
        xs = sorted(set(by_run[a]) & set(by_run[b]))
        if len(xs) < 2:
            continue
        va = np.array([by_run[a][x] for x in xs])
        vb = np.array([by_run[b][x] for x in xs])
        if name.startswith("eval/") and name.endswith("success_rate"):
            n = [min(sizes.get((a, x + 1), 0), sizes.get((b, x + 1), 0)) for x in xs]
            if min(n) > 0:
                se = [math.sqrt(p * (1 - p) / k + q * (1 - q) / k) for p, q, k in zip(va, vb, n)]
                hits = [abs(p - q) > Z * max(s, 1e-12) for p, q, s in zip(va, vb, se)]
                first = next((xs[k] for k in range(len(xs) - 1) if hits[k] and hits[k + 1]), None)
                out.append((name, first, f"binomial, n = {min(n)} episodes"))
                continue
        sd_a, sd_b = robust_sd(va), robust_sd(vb)
        first = parting_point(xs, va, vb, sd_a, sd_b, WINDOW, SUSTAIN)
        out.append((name, first, f"scatter sd {sd_a:.3g} / {sd_b:.3g}"))
    return out


def _episode(catalog: Catalog, a: str, b: str) -> list[str]:
    """The side-by-side lines of one validation seed played by both final policies."""
    try:
        rows = query(
            catalog,
            "with last as (select run, max(policy_version) v from evals "
            f"where run in ('{_q(a)}', '{_q(b)}') group by run) "
            "select e.run, e.policy_version, e.env, e.seed, e.temperature, e.success, e.turns from evals e "
            "join last on e.run = last.run and e.policy_version = last.v where e.sample = 0 "
            "order by e.env, e.seed, e.temperature",
        ).to_pylist()
    except UserError:
        return []
    played: dict[tuple[str, int, float], dict[str, dict[str, Any]]] = {}
    for r in rows:
        played.setdefault((r["env"], r["seed"], r["temperature"]), {})[r["run"]] = r
    both = [k for k, v in played.items() if a in v and b in v]
    if not both:
        return []
    greedy = [k for k in both if k[2] == 0] or both
    differ = [k for k in greedy if played[k][a]["success"] != played[k][b]["success"]]
    env, seed, temp = (differ or greedy)[0]
    ra, rb = played[(env, seed, temp)][a], played[(env, seed, temp)][b]
    lines = [
        f"{env} seed {seed} at T = {temp:g}: {a} v{ra['policy_version']} "
        f"{'succeeds' if ra['success'] else 'fails'}, {b} v{rb['policy_version']} "
        f"{'succeeds' if rb['success'] else 'fails'}"
    ]
    width = max(len(a), len(b))
    for t in range(max(len(ra["turns"]), len(rb["turns"]))):
        lines.append(f"turn {t + 1}")
        for run, r in ((a, ra), (b, rb)):
            if t >= len(r["turns"]):
                lines.append(f"  {run:<{width}}  (ended)")
                continue
            turn = r["turns"][t]
            state = " / ".join(x for x in (turn["state"] or "").splitlines() if x.strip())
            lines.append(f"  {run:<{width}}  state: {state}")
            lines.append(f"  {'':<{width}}  answer: {turn['answer'] or turn['response']!r}  reward {turn['reward']:g}")
    return lines


def diff_runs(catalog: Catalog, a: str, b: str) -> RunDiff:
    """Everything `pipeline diff` prints (module docstring)."""
    ra, rb = _record(catalog, a), _record(catalog, b)
    settings = differing_settings(recorded_settings(ra), recorded_settings(rb))
    sa, sb = read_steps(catalog.root, a), read_steps(catalog.root, b)
    steps_a = sa.to_pylist() if sa is not None else []
    keys_b = {(s["iteration"], s["node"]): s["key"] for s in (sb.to_pylist() if sb is not None else [])}
    shared = [s for s in steps_a if keys_b.get((s["iteration"], s["node"])) == s["key"]]
    parted = next(
        ((s["iteration"], s["node"]) for s in steps_a if keys_b.get((s["iteration"], s["node"])) != s["key"]), None
    )
    machines = machine.differences(ra.get("machine"), rb.get("machine"))
    return RunDiff(
        a,
        b,
        settings,
        len(shared),
        (len(steps_a), len(keys_b)),
        parted,
        curves(catalog, a, b),
        _episode(catalog, a, b),
        machines,
    )


def render(d: RunDiff) -> str:
    """The text `pipeline diff` prints."""
    lines = [f"settings that differ ({len(d.settings)}):"]
    for s in d.settings:
        lines.append(f"  {s.path}: {s.a if s.a is not None else '(not set)'} [{s.a_source}]")
        lines.append(f"  {' ' * len(s.path)}  {s.b if s.b is not None else '(not set)'} [{s.b_source}]")
    if not d.settings:
        lines.append("  none")
    where = (
        "they never part"
        if d.parted is None
        else f"they part at {'once' if d.parted[0] is None else f'iteration {d.parted[0]}'}, node {d.parted[1]}"
    )
    lines.append(
        f"steps: {d.shared_steps} shared in the catalog ({d.a}: {d.steps[0]} steps, {d.b}: {d.steps[1]}); {where}"
    )
    if d.machine is None:
        lines.append(
            "machines: not known for one of them (a run made before runs kept their machine, or an unreadable record)"
        )
    elif not d.machine:
        lines.append("machines: the same kind (no recorded difference)")
    else:
        lines.append(f"machines that differ ({len(d.machine)}): a step either run computed may differ in its last bits")
        for key, va, vb in d.machine:
            lines.append(f"  {key}: {va if va is not None else '(not recorded)'}")
            lines.append(f"  {' ' * len(key)}  {vb if vb is not None else '(not recorded)'}")
    parted_curves = sorted((c for c in d.curves if c[1] is not None), key=lambda c: (c[1], c[0]))
    lines.append(f"curves that part beyond noise (z > {Z:g}), by the first iteration where they do:")
    for name, first, noise in parted_curves:
        lines.append(f"  {first:>4}  {name}  ({noise})")
    if not parted_curves:
        lines.append("  none")
    same = [c[0] for c in d.curves if c[1] is None]
    if same:
        lines.append(f"no difference beyond noise ({len(same)}): {', '.join(same)}")
    if d.episode:
        lines.append("one validation episode, both final policies:")
        lines += ["  " + x for x in d.episode]
    return "\n".join(lines)
