"""The summary that opens a run report (`pipelines.report.page`): what ran, how eval success
moved with its 95% Wilson intervals and a verdict, the warnings that fired, and where
the wall time went."""

from __future__ import annotations

import html
from typing import Any

from catalog.query import query
from catalog.store import Catalog
from common.errors import UserError
from pipelines.report.intervals import wilson


def _evals(catalog: Catalog, run: str) -> list[dict[str, Any]]:
    q = run.replace("'", "''")
    try:
        return query(
            catalog,
            "select temperature t, policy_version v, sum(success::int)::bigint k, count(*) n from evals "
            f"where run = '{q}' group by all order by t desc, v",
        ).to_pylist()
    except UserError:  # no evals in the catalog
        return []


def summary(catalog: Catalog, run: str, events: list[dict[str, Any]]) -> str:
    """The run at a glance: what ran, eval success first -> last with its interval and
    a verdict, the warnings that fired, and where the wall time went."""
    q = run.replace("'", "''")
    info = query(
        catalog,
        f"select status, progress, iterations, epoch(finished_at) - epoch(started_at) s from runs where run = '{q}'",
    ).to_pylist()[0]
    steps = query(
        catalog,
        f"select count(*) n, sum((status = 'ran')::int) ran, count(distinct node) nodes from steps where run = '{q}'",
    ).to_pylist()[0]
    lines = [
        f"<b>{html.escape(run)}</b>: {html.escape(str(info['status']))}, {info['iterations']} iterations, "
        f"{steps['nodes']} stages, {steps['n']} steps ({steps['ran'] or 0} ran, the rest from the catalog)"
        + (f"; now {html.escape(info['progress'])}" if info["status"] == "running" and info["progress"] else "")
    ]
    rows = _evals(catalog, run)
    for t in dict.fromkeys(r["t"] for r in rows):
        curve = [r for r in rows if r["t"] == t]
        first, last = curve[0], curve[-1]
        lo0, hi0 = wilson(first["k"], first["n"])
        lo1, hi1 = wilson(last["k"], last["n"])
        verdict = (
            "rose beyond noise"
            if lo1 > hi0
            else "fell beyond noise"
            if hi1 < lo0
            else "no change beyond noise"
            if len(curve) > 1
            else "one eval"
        )
        lines.append(
            f"eval success (T={t:g}, {first['n']} episodes): v{first['v']} {first['k'] / first['n']:.1%} "
            f"[{lo0:.1%}, {hi0:.1%}] &rarr; v{last['v']} <b>{last['k'] / last['n']:.1%}</b> "
            f"[{lo1:.1%}, {hi1:.1%}] (95% Wilson intervals): <b>{verdict}</b>"
        )
    if events:
        fired: dict[str, list[int]] = {}
        for e in events:
            fired.setdefault(e["rule"], []).append(e["iteration"])
        lines.append(
            "warnings: "
            + "; ".join(
                f"{html.escape(rule)} {len(its)}x from iteration {min(its)}" for rule, its in sorted(fired.items())
            )
        )
    else:
        lines.append("warnings: none fired")
    spent = sorted(timings(catalog, run), key=lambda r: -(r["seconds_ran"] or 0))
    total = sum(r["seconds_ran"] or 0 for r in spent) or 1.0
    wall = f"{info['s']:.0f} s" if info["s"] is not None else "not finished"
    where = ", ".join(f"{html.escape(r['node'])} {100 * (r['seconds_ran'] or 0) / total:.0f}%" for r in spent[:4])
    lines.append(f"wall time {wall}; stage time by node: {where}")
    return '<div class="summary">' + "<br>".join(lines) + "</div>"


def timings(catalog: Catalog, run: str) -> list[dict[str, Any]]:
    """Per pipeline node: its steps, how many ran and their seconds, and where they ran
    (the `placement` view: the driver, and how many engine actors or Ray Train workers
    on how many Ray nodes)."""
    q = run.replace("'", "''")
    rows = query(
        catalog,
        f"select node, stage, count(*) as steps, sum((status = 'ran')::int) as ran, "
        f"round(sum(case when status = 'ran' then seconds else 0 end), 2) as seconds_ran "
        f"from steps where run = '{q}' group by node, stage order by min(finished_at)",
    ).to_pylist()
    places = query(
        catalog,
        'select node, role, count(distinct "index") as n, count(distinct ray_node) as nodes '
        f"from placement where run = '{q}' and role <> 'driver' group by node, role order by node, role",
    ).to_pylist()
    where: dict[str, list[str]] = {}
    for p in places:
        n, nodes = p["n"], p["nodes"]
        where.setdefault(p["node"], []).append(
            f"{n} {p['role']}{'s' if n != 1 else ''} on {nodes} node{'s' if nodes != 1 else ''}"
        )
    return [{**r, "ran on": ", ".join(where.get(r["node"], [])) or "driver"} for r in rows]
