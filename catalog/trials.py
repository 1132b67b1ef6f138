"""Sweep trial records: one row per finished trial, beside the runs they made.

A sweep (`pipelines.sweep.tune`) runs each trial as a pipeline run named
``<sweep>-<trial>``; when a trial ends its record is written atomically to
``sweeps/<sweep>/trials/<trial>.parquet`` and joins the `trials` view. The
records are also how an interrupted sweep resumes: a trial with a record whose
status is final is not run again (unless it ran another base spec or code: its record
then moves to ``sweeps/<sweep>/superseded/``). ``sweeps/<sweep>/base.json`` holds the settings of
the sweep's base spec (its fixed overrides applied), by which a report tells which
level is the default (`write_base`).
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.fs import Root

TRIAL_SCHEMA = pa.schema(
    [
        ("sweep", pa.string()),
        ("trial", pa.string()),
        ("run", pa.string()),
        ("status", pa.string()),
        ("params", pa.string()),
        ("overrides", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("best", pa.float64()),
        ("iterations", pa.int64()),
        ("seconds", pa.float64()),
        ("finished_at", pa.timestamp("ms", tz="UTC")),
        ("error", pa.string()),
    ]
)
FINAL = ("finished", "stopped")  # statuses a resumed sweep does not run again


@dataclass(frozen=True)
class TrialRecord:
    """How one trial ended.

    Attributes:
        params: the searched values as the search algorithm saw them (JSON).
        overrides: the ``-o`` overrides the trial's run used (JSON mapping).
        value / best: the ranking metric at the last report / best over reports.
        iterations: iterations reported; status ``stopped`` = ended early by the scheduler.
    """

    sweep: str
    trial: str
    run: str
    status: str  # "finished" | "stopped" | "failed"
    params: str
    overrides: str
    metric: str
    value: float | None
    best: float | None
    iterations: int
    seconds: float
    error: str | None = None
    finished_at: float = field(default_factory=time.time)


def write_trial(root: Root, record: TrialRecord) -> None:
    """Publish one trial's record (replacing an earlier one of the same trial)."""
    row = asdict(record) | {"finished_at": int(record.finished_at * 1000)}
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([row], schema=TRIAL_SCHEMA), sink, write_page_checksum=True)
    root.put_atomic(sink.getvalue(), "sweeps", record.sweep, "trials", f"{record.trial}.parquet")


def supersede(root: Root, sweep: str, trial: str) -> None:
    """Move trial `trial`'s record out of the sweep's records (and the `trials` view) into
    ``sweeps/<sweep>/superseded/``: it ran another base spec or code than the sweep has
    now, and its point runs again (`pipelines.sweep.tune.outdated`). Kept, not deleted."""
    name = f"{trial}.parquet"
    root.put_atomic(root.read_bytes("sweeps", sweep, "trials", name), "sweeps", sweep, "superseded", name)
    root.fs.delete_file(root.path("sweeps", sweep, "trials", name))


def write_base(root: Root, sweep: str, base: str, settings: dict[str, str]) -> None:
    """Record the base spec's file name and its settings (path -> value as the run
    records show it, `pipelines.spec.explain.recorded`), those a run's name, seed and
    place leave out."""
    data = {"base": base, "settings": settings}
    root.put_atomic(json.dumps(data, sort_keys=True).encode(), "sweeps", sweep, "base.json")


def read_base(root: Root, sweep: str) -> dict | None:
    """What `write_base` recorded, or None (a sweep of an earlier version, or unreadable)."""
    try:
        data = json.loads(root.read_bytes("sweeps", sweep, "base.json"))
    except (FileNotFoundError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("settings"), dict) else None


def trial_files(root: Root) -> list[str]:
    """URIs of every trial record of every sweep."""
    return [
        root.uri_of("sweeps", s, "trials", f)
        for s in root.list_dirs("sweeps")
        for f in root.list_files("sweeps", s, "trials")
        if f.endswith(".parquet")
    ]


def read_trials(root: Root, sweep: str) -> list[dict]:
    """The records of one sweep, as dicts."""
    rows: list[dict] = []
    for f in root.list_files("sweeps", sweep, "trials"):
        if f.endswith(".parquet"):
            rows += pq.read_table(root.path("sweeps", sweep, "trials", f), filesystem=root.fs).to_pylist()
    return rows
