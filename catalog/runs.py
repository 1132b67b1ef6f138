"""Run records: which runs exist, and which result each of their steps used.

Results are shared between runs (keys do not contain the run name), so what a run
did is recorded beside them: ``runs/<run>/run.parquet`` (one row) and
``runs/<run>/steps.parquet`` (one row per stage execution or cache hit). Both are
rewritten atomically as the run advances, so a reader sees a consistent state and a
crashed run shows status ``running`` or ``failed`` with the steps it completed.

Those two files describe the run's latest invocation (what the views show). Every
invocation also keeps its own copy under ``runs/<run>/invocations/<id>/``, never
overwritten by another: two processes running the same name at once keep both
records, and the results a run has ever used (what `pipeline gc` keeps) are the
union of all of them, so a failed or partial re-run never shrinks that set. Each
step row records the SHA-256 of the result's manifest as it was used, which
`pipeline verify` compares with the manifest now.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field, replace

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.fs import Root
from catalog.manifests import is_name
from common.errors import CatalogError

INVOCATIONS = "invocations"

RUN_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("spec_file", pa.string()),
        ("spec", pa.string()),
        ("status", pa.string()),
        ("started_at", pa.timestamp("ms", tz="UTC")),
        ("finished_at", pa.timestamp("ms", tz="UTC")),
        ("iterations", pa.int64()),
        ("seed", pa.int64()),
        ("host", pa.string()),
        ("error", pa.string()),
        ("invocation", pa.string()),
        ("settings", pa.string()),
        ("progress", pa.string()),
        ("machine", pa.string()),
    ]
)
STEP_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("iteration", pa.int64()),
        ("node", pa.string()),
        ("stage", pa.string()),
        ("key", pa.string()),
        ("status", pa.string()),
        ("seconds", pa.float64()),
        ("finished_at", pa.timestamp("ms", tz="UTC")),
        ("invocation", pa.string()),
        ("manifest_sha256", pa.string()),
        ("placement", pa.string()),
    ]
)
EVENT_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("iteration", pa.int64()),
        ("rule", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("reference", pa.float64()),
        ("threshold", pa.float64()),
        ("message", pa.string()),
    ]
)


@dataclass
class RunRecord:
    """The mutable record of one run (its row in the `runs` view)."""

    run: str
    spec_file: str
    spec: str
    iterations: int
    seed: int
    status: str = "running"
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    host: str = field(default_factory=socket.gethostname)
    error: str | None = None
    invocation: str = field(default_factory=lambda: new_invocation())
    settings: str | None = None  # JSON: every typed setting -> {value, source} (`pipelines.spec.explain.recorded`)
    progress: str | None = None  # how far the running step has got (`pipelines.run.hooks.StepProgress`), while it runs
    machine: str | None = None  # JSON: the driver's machine (`common.machine.describe`)


def new_invocation() -> str:
    """A per-process id for one `pipeline run` of a name: UTC time, pid, a nonce."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class StepRecord:
    """One stage of one iteration of a run: the key it used and whether it ran."""

    run: str
    iteration: int | None
    node: str
    stage: str
    key: str
    status: str  # "ran" | "cached" | "reused" (a periodic step run earlier in this run)
    seconds: float
    finished_at: float
    invocation: str = ""
    manifest_sha256: str | None = None
    # JSON, for a step that ran: [{role, index, node, host, rows}], the driver, then the engine
    # actors or Ray Train workers the stage used (`stages.registry.StageContext.place`)
    placement: str | None = None


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, write_page_checksum=True)  # read_record checks them
    return sink.getvalue()


class RunLog:
    """Writes one run's records to the catalog."""

    def __init__(self, root: Root, record: RunRecord) -> None:
        self.root, self.record = root, record
        self.steps: list[StepRecord] = []
        self.events: list[dict] = []
        self.save()
        self._write_events()

    def add_step(self, step: StepRecord) -> None:
        try:
            digest: str | None = hashlib.sha256(self.root.read_bytes("results", step.key, "manifest.json")).hexdigest()
        except (FileNotFoundError, OSError):
            digest = None
        self.steps.append(replace(step, invocation=self.record.invocation, manifest_sha256=digest))
        rows = [asdict(s) | {"finished_at": _ms(s.finished_at)} for s in self.steps]
        self._put(_parquet_bytes(pa.Table.from_pylist(rows, schema=STEP_SCHEMA)), "steps.parquet")

    def _put(self, data: bytes, name: str) -> None:
        """Write one record file: this invocation's own copy, then the run's latest."""
        run = self.record.run
        self.root.put_atomic(data, "runs", run, INVOCATIONS, self.record.invocation, name)
        self.root.put_atomic(data, "runs", run, name)

    def add_events(self, events: list[dict]) -> None:
        """Record warnings (rows of `EVENT_SCHEMA` without `run`) in the `events` view."""
        self.events += [{"run": self.record.run, **e} for e in events]
        self._write_events()

    def _write_events(self) -> None:
        table = pa.Table.from_pylist(self.events, schema=EVENT_SCHEMA)
        self._put(_parquet_bytes(table), "events.parquet")

    def finish(self, status: str, error: str | None = None) -> None:
        self.record.status, self.record.error = status, error
        self.record.finished_at = time.time()
        self.save()

    def save(self) -> None:
        row = asdict(self.record)
        row["started_at"], row["finished_at"] = _ms(row["started_at"]), _ms(row["finished_at"])
        table = pa.Table.from_pylist([row], schema=RUN_SCHEMA)
        self._put(_parquet_bytes(table), "run.parquet")


def read_record(root: Root, path: str, columns: list[str] | None = None) -> pa.Table:
    """A run record file (run, steps, events), read in one go: a live run replaces
    these files while others read them (`Root.put_atomic`), and a reader that opens one
    twice (Parquet's footer, then its data) can meet the old and the new file ("Invalid
    data"); the bytes of one open are one version."""
    with root.fs.open_input_stream(path) as stream:
        data = stream.readall()
    return pq.read_table(pa.BufferReader(data), columns=columns, page_checksum_verification=True)


def run_names(root: Root) -> list[str]:
    """The runs recorded under ``runs/`` (folders whose name is not a run name are skipped)."""
    return [r for r in root.list_dirs("runs") if is_name(r)]


def step_files(root: Root, run: str) -> list[str]:
    """Paths of every steps record of run `run`: the latest, and each invocation's."""
    files = [root.path("runs", run, "steps.parquet")]
    return files + [
        root.path("runs", run, INVOCATIONS, i, "steps.parquet") for i in root.list_dirs("runs", run, INVOCATIONS)
    ]


def every_step_key(root: Root, run: str) -> set[str]:
    """The result keys that any invocation of run `run` ever recorded (module docstring)."""
    keys: set[str] = set()
    for f in step_files(root, run):
        try:
            keys.update(read_record(root, f, ["key"])["key"].to_pylist())
        except FileNotFoundError:
            continue
        except (pa.ArrowInvalid, OSError) as exc:
            raise CatalogError(
                f"catalog {root.uri}: {f} is unreadable ({str(exc).splitlines()[0][:120]}); "
                "the results this run used cannot be told"
            ) from None
    return keys


def read_steps(root: Root, run: str) -> pa.Table | None:
    """The steps of run `run` in the order they were taken, or None if there is no such run."""
    if not root.exists("runs", run, "steps.parquet"):
        return None
    return read_record(root, root.path("runs", run, "steps.parquet"))
