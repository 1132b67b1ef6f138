"""Write every results table of the README and docs/ from the records in
experiments/results/, so that a figure a reader sees is the record's, digit for digit.

A table is a marker pair in a page; everything between the two is the render's:

    <!-- render: seeds-starpo rows=0,90 -->
    ...written by this script...
    <!-- /render -->

The forms (NAME is a record in experiments/results/, without `.json`; `bench/NAME` one in
bench/results/):
- `NAME [table=K] [rows=A,B] [without=C]`: the K-th Markdown table the record printed (1:
  the first), the rows whose first cell is one of A, B (default: all) and not C, then its
  `gain` line if any.
- `columns NAME [rows=A,B]`: a record printed as aligned columns (experiments/comparators.py)
  as a Markdown table, the rows whose name starts with A or B.
- `paired REF NAME [NAME ...] [labels=a,b,c]`: seeds records at their last common version,
  each level's seeds, mean and 95% interval, and its difference to REF paired by seed.

Each table ends in a provenance line (the records, their commits, dates and machines).
`python experiments/render.py` rewrites the pages; `--check` changes nothing and exits 1
naming every page whose text differs from its render (`tests/test_render.py` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.pages import ROOT, pages

RECORDS = ROOT / "experiments" / "results"
BLOCK = re.compile(r"(<!-- render: ([^>]*?) -->\n)(.*?)(<!-- /render -->)", re.S)
#: the fields every record carries beside what it printed (CONTRIBUTING.md)
PROVENANCE = ("command", "commit", "date", "machine", "wall_s", "status", "superseded_by", "caveats")


class RenderError(Exception):
    """A marker that names no record, or a record that does not hold what it asks for."""


def record_path(name: str) -> Path:
    """Where a record is: `NAME` in experiments/results/, `bench/NAME` in bench/results/."""
    bench = name.startswith("bench/")
    stem = name.removeprefix("bench/")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", stem):
        raise RenderError(
            f"record {name!r}: expected a file name of experiments/results/ (or bench/ and one of bench/results/) "
            "without .json"
        )
    return (ROOT / "bench" / "results" if bench else RECORDS) / f"{stem}.json"


def record(name: str) -> dict[str, Any]:
    path = record_path(name)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RenderError(f"record {name}: {path.relative_to(ROOT)} cannot be read ({exc})") from None
    return data


def _tables(printed: list[str]) -> list[list[str]]:
    tables: list[list[str]] = []
    current: list[str] = []
    for line in [*printed, ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _first_cell(row: str) -> str:
    return row.strip("|").split("|")[0].strip()


def _table(rec: dict[str, Any], name: str, options: dict[str, str]) -> list[str]:
    tables = _tables(rec["printed"])
    k = int(options.get("table", "1"))
    if not 1 <= k <= len(tables):
        raise RenderError(f"record {name}: table={k}, but it printed {len(tables)} table(s)")
    head, rule, *rows = tables[k - 1]
    if "rows" in options:
        wanted = options["rows"].split(",")
        rows = [r for r in rows if _first_cell(r) in wanted]
        missing = set(wanted) - {_first_cell(r) for r in rows}
        if missing:
            raise RenderError(f"record {name}: rows {sorted(missing)} are not in its table {k}")
    if "without" in options:
        unwanted = options["without"].split(",")
        missing = set(unwanted) - {_first_cell(r) for r in rows}
        if missing:
            raise RenderError(f"record {name}: rows {sorted(missing)} are not in its table {k}")
        rows = [r for r in rows if _first_cell(r) not in unwanted]
    out = [head, rule, *rows]
    gain = [line for line in rec["printed"] if line.startswith("gain ")]
    if gain and k == 1:
        out += ["", gain[0][0].upper() + gain[0][1:] + "."]
    return out


_COLUMN = re.compile(r"^(.*?)\s+(-?\d+\.\d+%(?:\s+-?\d+\.\d+%)*)\s*$")


def _columns(rec: dict[str, Any], name: str, options: dict[str, str]) -> list[str]:
    rows = []
    header: list[str] = []
    for line in rec["printed"]:
        if not header and re.match(r"^\w+\s{2,}\w", line) and "%" not in line:
            header = line.split()
            continue
        match = _COLUMN.match(line)
        if header and match:
            rows.append([match.group(1).strip(), *match.group(2).split()])
    if not rows:
        raise RenderError(f"record {name}: no aligned columns in what it printed")
    if "rows" in options:
        prefixes = options["rows"].split(",")
        rows = [r for p in prefixes for r in rows if r[0].startswith(p)]
    width = len(rows[0])
    header = (header + [""] * width)[:width]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * width, *("| " + " | ".join(r) + " |" for r in rows)]


def _paired(recs: dict[str, dict[str, Any]], options: dict[str, str]) -> list[str]:
    from pipelines.report.intervals import mean_interval, rate_interval, shown

    names = list(recs)
    for n, rec in recs.items():
        if not {"seeds", "versions", "success", "episodes"} <= set(rec.get("data") or {}):
            raise RenderError(f"record {n}: not a seeds table (its data has no seeds, versions, success and episodes)")
    common = set.intersection(*(set(r["data"]["versions"]) for r in recs.values()))
    if not common:
        raise RenderError(f"records {names}: no policy version in common")
    last = max(common)
    labels = options["labels"].split(",") if "labels" in options else names
    if len(labels) != len(names):
        raise RenderError(f"labels={options['labels']}: {len(labels)} labels for {len(names)} records")

    def at(rec: dict[str, Any]) -> dict[int, float]:
        data = rec["data"]
        j = data["versions"].index(last)
        return {s: data["success"][i][j] for i, s in enumerate(data["seeds"])}

    ref = at(recs[names[0]])
    seeds = sorted(ref)
    out = [
        f"| level (v{last}) | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | 95% interval | minus the first, paired |",
        "|---|" + "---|" * (len(seeds) + 3),
    ]
    for name, label in zip(names, labels):
        rates = at(recs[name])
        data = recs[name]["data"]
        episodes = int(data["episodes"])
        cells = [f"{100 * rates[s]:.1f}%" if s in rates else "-" for s in seeds]
        values = [rates[s] for s in seeds if s in rates]
        pairs = [rates[s] - ref[s] for s in seeds if s in rates]
        diff = "-" if name == names[0] else f"{100 * statistics.fmean(pairs):+.1f} {shown(mean_interval(pairs), '+')}"
        out.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {100 * statistics.fmean(values):.1f}% | {shown(rate_interval(values, episodes))} | {diff} |"
        )
    return out


def footer(recs: dict[str, dict[str, Any]], page: Path) -> str:
    """The provenance line under a rendered table, its links relative to `page`."""
    parts = []
    for name, rec in recs.items():
        link = os.path.relpath(record_path(name), page.parent)
        parts.append(f"[{name}]({link}) ({rec['commit']}, {rec['date']}, {rec['machine']})")
    return "<sub>Record: " + "; ".join(parts) + "</sub>"


#: the options each marker form takes
OPTIONS = {"table": {"table", "rows", "without"}, "columns": {"rows"}, "paired": {"labels"}}


def render_block(spec: str, page: Path) -> str:
    """The text a marker's `spec` renders to (without the markers)."""
    words = shlex.split(spec)
    options = dict(w.split("=", 1) for w in words if "=" in w)
    args = [w for w in words if "=" not in w]
    if not args:
        raise RenderError(f"{page.name}: a render marker names no record")
    form = args[0] if args[0] in ("paired", "columns") else "table"
    unknown = set(options) - OPTIONS[form]
    if unknown:  # a misspelt option would otherwise render the whole table without a word
        raise RenderError(
            f"{page.name}: a {form} marker takes {', '.join(sorted(OPTIONS[form]))}, not {sorted(unknown)}"
        )
    names = {"paired": args[1:], "columns": args[1:2], "table": args[:1]}[form]
    if not names:
        raise RenderError(f"{page.name}: a {form} marker names no record")
    recs = {name: record(name) for name in names}
    if form == "paired":
        lines = _paired(recs, options)
    elif form == "columns":
        lines = _columns(recs[names[0]], names[0], options)
    else:
        lines = _table(recs[names[0]], names[0], options)
    return "\n".join([*lines, "", footer(recs, page)]) + "\n"


def render(text: str, page: Path) -> str:
    """The page with every render block rewritten from its records."""

    def one(match: re.Match[str]) -> str:
        return match.group(1) + render_block(match.group(2), page) + match.group(4)

    return BLOCK.sub(one, text)


def check() -> list[str]:
    """The pages whose committed text differs from their render (empty: all current)."""
    return [str(p.relative_to(ROOT)) for p in pages() if render(p.read_text(), p) != p.read_text()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args()
    try:
        if args.check:
            stale = check()
            for page in stale:
                print(f"{page}: differs from its records; run python experiments/render.py")
            sys.exit(1 if stale else 0)
        for page in pages():
            text = page.read_text()
            new = render(text, page)
            if new != text:
                page.write_text(new)
                print(f"rendered: {page.relative_to(ROOT)}")
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
