"""`pipeline report RUN [RUN ...]`: one self-contained HTML file about one or more runs.

It holds, for every run given (overlaid on the same axes):

- plots (matplotlib, embedded as PNG data and also saved beside the page): reward,
  success (train, and eval per environment), in-group reward std, entropy, gradient
  norm, response length and response diversity, each with the run's early warnings
  (`pipelines.run.watch`) marked where they fired;
- the warnings, the stage timings and the resolved spec of each run;
- a trajectory explorer over the first run's rollouts: pick environment, iteration,
  group and trajectory, then step through the turns (state, think, answer, parsed
  actions and their validity, reward).

Nothing is fetched when the page is viewed: data, images, script and style are inline.
The x axis is the policy version: a rollout of iteration i is sampled by version i,
and an eval after iteration i scores version i + 1 (the warm start is version 0).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog.query import query, run_outputs
from catalog.store import Catalog
from common.errors import UserError, did_you_mean
from pipelines.report.summary import summary, timings
from pipelines.report.template import PAGE
from pipelines.spec.rules import RULES


@dataclass(frozen=True)
class Plot:
    """One figure: the metrics drawn on it (label -> metric name); a `rate` is drawn on
    [0, 1], any other metric on a range no narrower than `FLOOR` of its size."""

    name: str
    title: str
    series: dict[str, str]
    ylabel: str
    rate: bool = False


#: the narrowest visible y range, as a share of the largest |value| (a change of 0.2%
#: must not fill the plot as if it were a collapse)
FLOOR = 0.2
#: the `eval_behaviour` shares the report plots, by their label (catalog/schemas.py defines them)
BEHAVIOUR_LABELS = {
    "moves into a hole": "into_hole",
    "moves into the edge": "into_edge",
    "moves into a wall": "into_wall",
    "pushes onto a target": "onto_target",
    "pushes into a corner": "into_corner",
    "copies a goal-line word": "copies_goal_word",
    "moves toward the goal": "toward_goal",
    "of hole moves, toward the goal": "hole_toward_goal",
}
BEHAVIOUR = tuple(BEHAVIOUR_LABELS.values())

PLOTS = (
    Plot("reward", "Reward", {"score mean": "rollout/score_mean"}, "trajectory score"),
    Plot(
        "success",
        "Success",
        {"train": "rollout/success_rate", "eval": "eval/success_rate", "eval greedy": "eval/greedy_success_rate"},
        "success rate",
        rate=True,
    ),
    Plot(
        "behaviour",
        "What the policy does at eval (eval_behaviour)",
        {label: f"behaviour/{name}" for label, name in BEHAVIOUR_LABELS.items()},
        "share of eval moves",
        rate=True,
    ),
    Plot(
        "in_group_std",
        "In-group reward std",
        {"all groups": "rollout/in_group_std", "kept groups": "filter/in_group_std_kept"},
        "std",
    ),
    Plot("entropy", "Policy entropy", {"entropy": "actor/entropy"}, "nats / token"),
    Plot("grad_norm", "Gradient norm", {"actor": "actor/grad_norm", "critic": "critic/grad_norm"}, "norm"),
    Plot(
        "response_length", "Response length", {"sampled tokens": "rollout/response_tokens_mean"}, "tokens / trajectory"
    ),
    Plot(
        "drift",
        "Re-tokenization drift of an agent program's answers (agent mode; recorded, not trained on)",
        {"rollout": "rollout/drift_tokens", "eval": "eval/drift_tokens"},
        "tokens / call",
    ),
    Plot(
        "diversity",
        "Response diversity",
        {
            "distinct-2 (batch)": "collapse/distinct2_batch",
            "duplicates (batch)": "collapse/duplicate_rate_batch",
            "top response share": "collapse/top_response_share",
        },
        "rate",
        rate=True,
    ),
    Plot(
        "mutual_info",
        "Does the answer depend on the state? (mutual_info)",
        {"MI(prompt; response)": "template/mi", "ceiling log N": "template/mi_max"},
        "nats / response",
    ),
    Plot(
        "retrieval",
        "Own prompt scores its response highest (mutual_info)",
        {"retrieval": "template/retrieval", "chance 1/N": "template/retrieval_chance"},
        "share of responses",
        rate=True,
    ),
)
EXPLORER_LIMIT = 3000  # trajectories in the explorer (evenly spaced iterations beyond it)


def _x(name: str, iteration: int | None) -> float:
    """Policy version of a metric row (see the module docstring)."""
    if name.startswith("eval/"):
        return 0.0 if iteration is None else iteration + 1.0
    return float(iteration if iteration is not None else 0)


def _series(catalog: Catalog, runs: list[str]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """run -> metric -> [(x, value)], eval metrics per environment included."""
    names = {m for p in PLOTS for m in p.series.values()}
    quoted = ", ".join("'" + r.replace("'", "''") + "'" for r in runs)
    rows = query(
        catalog,
        f"select run, iteration, name, value from metrics where run in ({quoted}) order by run, iteration nulls first",
    ).to_pylist()
    out: dict[str, dict[str, list[tuple[float, float]]]] = {r: {} for r in runs}
    for r in rows:
        is_env_eval = r["name"].startswith("eval/") and r["name"].endswith("/success_rate")
        if r["name"] in names or is_env_eval:
            if r["iteration"] is None and not r["name"].startswith("eval/"):
                continue  # once-stages (e.g. the warm start's demonstrations)
            out[r["run"]].setdefault(r["name"], []).append((_x(r["name"], r["iteration"]), r["value"]))
    for r in _behaviour(catalog, quoted):
        for name in BEHAVIOUR:
            if r[name] is not None:
                out[r["run"]].setdefault(f"behaviour/{name}", []).append((float(r["policy_version"]), r[name]))
    return out


def _behaviour(catalog: Catalog, quoted: str) -> list[dict[str, Any]]:
    """The `eval_behaviour` rows of the runs at the eval's sampling temperature (none
    when the catalog has no evals)."""
    try:
        return query(
            catalog,
            "select run, policy_version, "
            + ", ".join(f"avg({name}) {name}" for name in BEHAVIOUR)
            + " from eval_behaviour "
            f"where run in ({quoted}) and temperature > 0 group by all order by all",
        ).to_pylist()
    except UserError:
        return []


def _events(catalog: Catalog, runs: list[str]) -> list[dict[str, Any]]:
    quoted = ", ".join("'" + r.replace("'", "''") + "'" for r in runs)
    return query(catalog, f"select * from events where run in ({quoted}) order by run, iteration").to_pylist()


def _figure(
    plot: Plot, data: dict[str, dict[str, list[tuple[float, float]]]], events: list[dict[str, Any]], out: Path
) -> str | None:
    """Draw one plot; save it as PNG under `out`; return it as base64 (None: no data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    drawn = False
    values: list[float] = []
    styles = ("-", "--", ":", "-.")
    metrics = dict(plot.series)
    if plot.name == "success":  # and every environment's eval
        for run_data in data.values():
            for name in run_data:
                if name.startswith("eval/") and name.count("/") == 2:
                    metrics[f"eval {name.split('/')[1]}"] = name
        if any(k.startswith("eval ") for k in metrics):
            metrics.pop("eval")
    for r, (run, run_data) in enumerate(data.items()):
        for s, (label, metric) in enumerate(metrics.items()):
            points = run_data.get(metric)
            if not points:
                continue
            xs, ys = zip(*points)
            values += ys
            # one run: a colour per series; several: a colour per run (the same in every plot), a line style per series
            color, line = (f"C{s % 10}", "-") if len(data) == 1 else (f"C{r % 10}", styles[s % 4])
            name = label if len(data) == 1 else f"{run}: {label}"
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=name, color=color, linestyle=line)
            drawn = True
            for e in events:
                if e["run"] == run and e["metric"] == metric:
                    ax.plot([e["iteration"]], [e["value"]], marker="X", markersize=11, color="red", zorder=5)
                    ax.annotate(
                        e["rule"],
                        (e["iteration"], e["value"]),
                        textcoords="offset points",
                        xytext=(4, 6),
                        fontsize=7,
                        color="red",
                    )
    if not drawn:
        plt.close(fig)
        return None
    for e in events:
        ax.axvline(e["iteration"], color="red", alpha=0.15, linewidth=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    left, right = ax.get_xlim()
    if right - left < 2:  # integer ticks need two integers in view
        middle = round((left + right) / 2)
        ax.set_xlim(middle - 1, middle + 1)
    ax.set_ylim(*y_range(values, plot.rate))
    ax.set_title(plot.title)
    ax.set_xlabel("policy version (iteration)")
    ax.set_ylabel(plot.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    png = png_of(fig)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{plot.name}.png").write_bytes(png)
    return base64.b64encode(png).decode()


def png_of(fig: Any) -> bytes:
    """A matplotlib figure laid out, as PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def y_range(values: list[float], rate: bool) -> tuple[float, float]:
    """The y axis of a plot (see `Plot`): [0, 1] for rates (wider if a value is
    outside), else the data's range widened to at least `FLOOR` of its size."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    lo, hi = min(finite), max(finite)
    if rate:
        return min(0.0, lo) - 0.02, max(1.0, hi) + 0.02
    width = max(hi - lo, FLOOR * max(abs(lo), abs(hi)), 1e-6)
    middle = (lo + hi) / 2
    return middle - 0.55 * width, middle + 0.55 * width


def explorer_data(catalog: Catalog, run: str, limit: int = EXPLORER_LIMIT) -> list[dict[str, Any]]:
    """The run's rollout trajectories, turn by turn, for the explorer."""
    import pyarrow as pa

    tables = [catalog.table(a).read() for a in run_outputs(catalog, run, "trajectories")]
    if not tables:
        return []
    table = pa.concat_tables(tables, promote_options="default")
    if table.num_rows > limit:  # every step-th iteration, whole
        step = math.ceil(table.num_rows / limit)
        keep = set(sorted(set(table["iteration"].to_pylist()))[::step])
        table = table.filter(pa.array([i in keep for i in table["iteration"].to_pylist()]))
    cols = ["env", "iteration", "group", "sample", "score", "success", "end_reason", "turns"]
    rows = table.select(cols).to_pylist()
    for r in rows:
        r["turns"] = [
            {
                k: t[k]
                for k in ("turn", "state", "think", "answer", "actions", "valid", "executed", "reward", "format_ok")
            }
            for t in r["turns"]
        ]
    return rows


def write_report(catalog: Catalog, runs: list[str], out: Path) -> Path:
    """Write the report of `runs` to `out` (an .html file; PNGs in a folder beside it)."""
    known = set(query(catalog, "select run from runs").column(0).to_pylist())
    for r in runs:
        if r not in known:
            raise UserError(f"report: no run '{r}' in catalog {catalog.root.uri}{did_you_mean(r, known)}")
    data, events = _series(catalog, runs), _events(catalog, runs)
    images = out.with_suffix("")
    figures = []
    for plot in PLOTS:
        encoded = _figure(plot, data, events, images)
        if encoded is not None:
            figures.append(
                f'<figure><img class="plot" alt="{plot.title}" title="{images.name}/{plot.name}.png" '
                f'src="data:image/png;base64,{encoded}"></figure>'
            )
    sections = [_run_section(catalog, r, [e for e in events if e["run"] == r]) for r in runs]
    trajectories = explorer_data(catalog, runs[0])
    page = PAGE.format(
        title=html.escape(" vs ".join(runs)),
        summary="\n".join(summary(catalog, r, [e for e in events if e["run"] == r]) for r in runs)
        + _differences(catalog, runs),
        plots="\n".join(figures) or "<p>No metrics yet.</p>",
        runs="\n".join(sections),
        explorer_run=html.escape(runs[0]),
        data=json.dumps(trajectories).replace("</", "<\\/"),
        rules=html.escape(", ".join(f"{r.name} ({r.metric})" for r in RULES)),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return out


def _differences(catalog: Catalog, runs: list[str]) -> str:
    """Two runs: what `pipeline diff` says of them, as a section of the page."""
    if len(runs) != 2:
        return ""
    from pipelines.report.diff import diff_runs, render

    text = render(diff_runs(catalog, runs[0], runs[1]))
    return f'<section id="differences"><h2>Differences</h2><pre>{html.escape(text)}</pre></section>'


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v)


def _run_section(catalog: Catalog, run: str, events: list[dict[str, Any]]) -> str:
    q = run.replace("'", "''")
    info = query(
        catalog,
        f"select status, iterations, seed, spec_file, spec, started_at, finished_at from runs where run = '{q}'",
    ).to_pylist()[0]
    shown = [{k: e[k] for k in ("iteration", "rule", "metric", "value", "reference", "message")} for e in events]
    return (
        f'<section class="run"><h2>Run {html.escape(run)}</h2>'
        f"<p>{html.escape(str(info['status']))}, {info['iterations']} iterations, seed {info['seed']}, "
        f"{html.escape(str(info['spec_file']))}; started {info['started_at']}, finished {info['finished_at']}</p>"
        f'<h3>Early warnings</h3><div class="warnings">{_table(shown)}</div>'
        f"<h3>Stage timings</h3>{_table(timings(catalog, run))}"
        f"<details><summary>Resolved spec</summary><pre>{html.escape(info['spec'])}</pre></details></section>"
    )
