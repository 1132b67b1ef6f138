"""The early warnings of stored runs, replayed through the current rules (`pipelines.run.watch`):
which rules fire, at which iteration, with the template-collapse diagnostic read as the
run would read it now and with its quieting turned off (`warnings.sharpening_mi: null`).

    python experiments/warnings.py --catalog pipeline-data --like 'seeds-%'
    python experiments/warnings.py --catalog pipeline-data --like 'entropy%' -s length_spike=3.0

A run's metrics are read from the `metrics` view in iteration order, so this shows what a
change of a rule or a threshold would have said about runs already made, without running
them again. Prints one table row per run and setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import metrics_by_iteration, query
from catalog.store import Catalog, existing_catalog
from common.recording import run_script
from pipelines.run.watch import replay as replay_metrics
from pipelines.spec.rules import WarningsSection, settings_given


def replay(catalog: Catalog, run: str, cfg: WarningsSection) -> list[tuple[int, str]]:
    """The (iteration, rule) of every warning the run's stored metrics fire under `cfg`."""
    return replay_metrics(metrics_by_iteration(catalog, run), cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None, help="catalog root (default: $PIPELINE_CATALOG or ./pipeline-data)")
    ap.add_argument("--like", default="%", help="the runs, as a SQL LIKE on the run name")
    ap.add_argument("-s", "--set", action="append", default=[], help="a threshold, field=value (null: off)")
    args = ap.parse_args()
    catalog = existing_catalog(args.catalog)
    try:
        given = settings_given(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    pattern = args.like.replace("'", "''")
    runs = (
        query(catalog, f"select distinct run from metrics where run like '{pattern}' order by run")
        .column(0)
        .to_pylist()
    )
    print("| run | template diagnostic | warnings (iteration rule) |\n|---|---|---|")
    for run in runs:
        for label, extra in (("read", {}), ("quieting off", {"sharpening_mi": None})):
            fired = replay(catalog, run, dataclasses.replace(given, **extra))
            shown = ", ".join(f"{i} {rule}" for i, rule in fired) or "none"
            print(f"| {run} | {label} | {shown} |", flush=True)


if __name__ == "__main__":
    run_script(main)
