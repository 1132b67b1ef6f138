"""`pipeline report --sweep NAME`: a sweep's levels overlaid, each level's seeds as one band.

A *level* is a point of the sweep's space: what its trials set without the run seed
(which `sweep.num_samples` adds), so a level's trials are its seeds; a search without
repeats (optuna) has one trial a level, and a point of a sweep file whose fixed overrides
were edited since is a level of its own. For each level the page draws eval success at
the eval's sampling temperature by policy version, the mean over its seeds with the 95%
interval over seeds shaded (`pipelines.report.intervals.rate_interval`: inside 0-100%),
one colour a level; and a table of each level at the last version every trial reached:
success per seed, the mean and its interval, and the difference to the default level,
paired by run seed (a level's run of seed s against the default's run of seed s; a seed
that only one of the two has is left out, and the pairs are counted), with the interval
of the mean difference (`mean_interval`). A run with no eval at that temperature is left
out of its level and named under the table. The default
level is the one whose runs have the settings of the sweep's base spec
(`catalog.trials.read_base`; names, seeds and places aside); where no level has them
(or the sweep was run by an earlier version), the first level stands in.
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from catalog.manifests import is_name
from catalog.query import query
from catalog.store import Catalog
from catalog.trials import FINAL, read_base, read_trials
from common.errors import UserError, did_you_mean
from pipelines.report.intervals import mean_interval, rate_interval, shown
from pipelines.report.page import png_of
from pipelines.spec.explain import comparable


@dataclass
class Level:
    """One point of the space: what it sets (the overrides that differ between levels)
    and its runs, in seed order, with eval success by policy version."""

    label: str
    runs: list[str]
    seeds: list[int] = field(default_factory=list)
    success: dict[str, dict[int, float]] = field(default_factory=dict)  # run -> version -> rate
    episodes: int = 0  # the fewest episodes behind one rate
    default: bool = False  # its runs have the base spec's settings (module docstring)
    without_eval: list[str] = field(default_factory=list)  # its runs with no eval at the temperature read


def levels(catalog: Catalog, sweep: str) -> tuple[list[Level], float]:
    """The sweep's levels with their eval success, and the temperature it was read at."""
    if not is_name(sweep):
        raise UserError(f"report: --sweep {json.dumps(sweep)[:80]}: a sweep name is letters, digits, '_', '.' or '-'")
    trials = [t for t in read_trials(catalog.root, sweep) if t["status"] in FINAL]
    if not trials:
        known = sorted(catalog.root.list_dirs("sweeps"))
        raise UserError(
            f"report: no ended trial of a sweep '{sweep}' in catalog {catalog.root.uri}{did_you_mean(sweep, known)}"
        )
    grouped: dict[str, list[dict[str, Any]]] = {}
    for t in sorted(trials, key=lambda t: (t["params"], t["run"])):
        # a level is what its trials set, the seed aside (a point of a sweep file edited since is another level)
        setting = {k: v for k, v in json.loads(t["overrides"]).items() if k != "run.seed"}
        grouped.setdefault(json.dumps(setting, sort_keys=True), []).append(t)
    settings = [json.loads(key) for key in grouped]
    varied = sorted({k for s in settings for k in s if any(o.get(k) != s.get(k) for o in settings)})
    out = [
        Level(", ".join(f"{k}={json.dumps(s.get(k))}" for k in varied) or "the base spec", [t["run"] for t in ts])
        for s, ts in zip(settings, grouped.values())
    ]
    quoted = ", ".join("'" + t["run"].replace("'", "''") + "'" for t in trials)
    rows = query(
        catalog,
        "select e.run, r.seed, e.temperature t, e.policy_version v, avg(e.success::int) s, count(*) n "
        f"from evals e join runs r using (run) where e.run in ({quoted}) and e.temperature > 0 group by all",
    ).to_pylist()
    if not rows:
        raise UserError(f"report: the trials of sweep '{sweep}' have no eval at a temperature above 0 yet")
    counts: dict[float, int] = {}
    for r in rows:
        counts[r["t"]] = counts.get(r["t"], 0) + r["n"]
    temperature = max(counts, key=lambda t: (counts[t], -t))
    seed_of = {r["run"]: r["seed"] for r in rows}
    ended = {t["run"]: t["finished_at"].timestamp() if t["finished_at"] else 0.0 for t in trials}
    for level in out:
        # one run a seed, the first to end (a sweep resumed by an earlier version from another checkout ran
        # its points again)
        level.runs.sort(key=lambda run: (seed_of.get(run, 0), ended[run], run))
        level.runs = [
            run
            for i, run in enumerate(level.runs)
            if i == 0 or seed_of.get(run) is None or seed_of.get(run) != seed_of.get(level.runs[i - 1])
        ]
    _mark_default(catalog, sweep, out)
    for level in out:
        mine = [r for r in rows if r["run"] in level.runs and r["t"] == temperature]
        evaluated = {r["run"] for r in mine}
        level.without_eval = [run for run in level.runs if run not in evaluated]
        level.runs = [run for run in level.runs if run in evaluated]
        level.seeds = [seed_of.get(run, -1) for run in level.runs]
        level.success = {run: {r["v"]: r["s"] for r in mine if r["run"] == run} for run in level.runs}
        level.episodes = min((r["n"] for r in mine), default=1)
    return out, temperature


def _mark_default(catalog: Catalog, sweep: str, all_levels: list[Level]) -> None:
    """Set `Level.default` on the level whose first run has the base spec's settings."""
    base = read_base(catalog.root, sweep)
    if base is None:
        return
    firsts = {level.runs[0]: level for level in all_levels if level.runs}
    quoted = ", ".join("'" + run.replace("'", "''") + "'" for run in firsts)
    for row in query(catalog, f"select run, settings from runs where run in ({quoted})").to_pylist():
        try:
            settings = comparable(json.loads(row["settings"] or "{}"))
        except ValueError:
            continue
        if settings == base["settings"]:
            firsts[row["run"]].default = True
            firsts[row["run"]].label += " (the default)"


def reference(all_levels: list[Level]) -> Level:
    """The level the others are compared with: the default, else the first."""
    return next((level for level in all_levels if level.default), all_levels[0])


def _last_common(all_levels: list[Level]) -> int | None:
    """The last policy version every run of every level was evaluated at."""
    common: set[int] | None = None
    for level in all_levels:
        for by_version in level.success.values():
            common = set(by_version) if common is None else common & set(by_version)
    return max(common) if common else None


def table(all_levels: list[Level]) -> list[dict[str, str]]:
    """Each level at the last common version: seeds, mean, interval, difference to the
    default level (`reference`)."""
    shown_levels = [level for level in all_levels if level.runs]
    last = _last_common(shown_levels)
    if last is None:
        return []
    ref = reference(all_levels)
    by_seed = {seed: ref.success[run][last] for seed, run in zip(ref.seeds, ref.runs)}
    against = "the default" if ref.default else "the first level"
    out = []
    for level in shown_levels:
        rates = [level.success[run][last] for run in level.runs]
        pairs = [rate - by_seed[seed] for seed, rate in zip(level.seeds, rates) if seed in by_seed]
        if level is ref:
            difference = "-"
        elif not pairs:
            difference = "- (no run seed in common)"
        else:
            missing = "" if len(pairs) == len(rates) == len(by_seed) else f" ({len(pairs)} pairs)"
            difference = f"{100 * statistics.fmean(pairs):+.1f} {shown(mean_interval(pairs), '+')}{missing}"
        row = {
            "level": level.label,
            "seeds": ", ".join(str(s) for s in level.seeds),
            f"success at v{last}": ", ".join(f"{100 * r:.1f}%" for r in rates),
            "mean": f"{100 * statistics.fmean(rates):.1f}%",
            "95% interval over seeds": shown(rate_interval(rates, level.episodes)),
            f"difference to {against} (paired by seed)": difference,
        }
        out.append(row)
    return out


def _figure(all_levels: list[Level], temperature: float) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.0), dpi=100)
    for i, level in enumerate(all_levels):
        versions = sorted(set.intersection(*(set(v) for v in level.success.values())))
        if not versions:
            continue
        rates = [[level.success[run][v] for run in level.runs] for v in versions]
        mean = [statistics.fmean(r) for r in rates]
        color = f"C{i % 10}"
        ax.plot(
            versions,
            mean,
            color=color,
            linewidth=2,
            marker="o" if len(versions) < 30 else None,
            markersize=3,
            label=f"{level.label} ({len(level.runs)} seed{'s' if len(level.runs) > 1 else ''})",
        )
        bands = [rate_interval(r, level.episodes) for r in rates]
        if all(b is not None for b in bands):
            ax.fill_between(versions, [b[0] for b in bands], [b[1] for b in bands], color=color, alpha=0.18)  # type: ignore[index]
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("policy version (iteration)")
    ax.set_ylabel(f"eval success (T={temperature:g})")
    ax.set_title("Levels: mean over seeds, 95% interval shaded")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return png_of(fig)


def write_sweep_report(catalog: Catalog, sweep: str, out: Path) -> Path:
    """Write the page of `sweep` to `out` (its plot also beside it, as <out>.png)."""
    all_levels, temperature = levels(catalog, sweep)
    png = _figure(all_levels, temperature)
    rows = table(all_levels)
    against = "the default level" if reference(all_levels).default else "the first level (no level is the default)"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in (rows[0] if rows else {}))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r.values()) + "</tr>" for r in rows)
    runs = "".join(f"<li>{html.escape(level.label)}: {html.escape(', '.join(level.runs))}</li>" for level in all_levels)
    left = [run for level in all_levels for run in level.without_eval]
    if left:
        runs += f"<li>left out, with no eval at T={temperature:g}: {html.escape(', '.join(left))}</li>"
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Sweep report: {html.escape(sweep)}</title><style>"
        "body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }"
        "table { border-collapse: collapse; font-size: .9em; } td, th { border: 1px solid #ddd; padding: 2px 6px; }"
        "img { max-width: 100%; }</style></head><body>"
        f"<h1>Sweep report: {html.escape(sweep)}</h1>"
        f'<img alt="levels" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<h2>Levels</h2><table><tr>{head}</tr>{body}</table>"
        "<p>Intervals: Student's t over the seeds on the logit scale for a level's mean success (inside 0-100%), "
        f"and on the paired differences for the difference to {against} (docs/method.md#what-we-measure). "
        "With few seeds they are wide.</p>"
        f"<h2>Runs</h2><ul>{runs}</ul></body></html>"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    out.with_suffix(".png").write_bytes(png)
    return out
