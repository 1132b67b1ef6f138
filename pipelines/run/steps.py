"""One step of a plan against the catalog: found there (and sound), or run now under
its lease and committed. The runner (`pipelines.run.runner`) decides which steps to walk
and in what order; this module does what a single step takes.

Two checks keep damaged results out of a run. Deciding whether a step is cached reads
its manifest and the sizes of its files (cheap, every step). Before a step runs,
every byte of each result it reads (its inputs, its sources, the tables a selection
points into) is checked against the SHA-256 its manifest recorded, once per result
and process: a result that differs is named in one line, moved aside and computed
again (its step is in the plan), then the step runs on the new one. So a flipped
byte in a committed file is never read as valid, and a catalog that nothing reads
is not read through. A result this process committed is not checked again when a
later step of the same run reads it (its hashes were taken from the bytes written), so
a run that computes everything hashes nothing twice; the checks fall on resumes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from catalog.holds import Holds
from catalog.keys import canonical, parse_address
from catalog.leases import acquire
from catalog.manifests import ManifestError
from catalog.store import Catalog, ResultWriter
from common.errors import CatalogError, CatalogFull, StageFailed, UserError
from common.placement import here
from pipelines.graph.plan import Step
from pipelines.run.hooks import Event, Hooks, StepEvent, StepProgress, StepStart
from pipelines.run.progress import Display
from pipelines.spec.build import Spec
from stages.registry import StageContext, StageResult

#: seconds between two progress reports of one step that reach the hooks
PROGRESS_EVERY = 0.5


def started(step: Step) -> StepStart:
    """The event of a step about to be taken (from the catalog or run)."""
    return StepStart(
        label=step.label, node=step.node.name, stage=step.node.stage.name, iteration=step.iteration, key=step.key
    )


def ended(step: Step, status: str, metrics: dict[str, float], t0: float, placement: str | None = None) -> StepEvent:
    """The event of a step that ended (`status`) after starting at `t0` (`placement`:
    where a step that ran did, `StepRunner.placed`)."""
    return StepEvent(
        label=step.label,
        node=step.node.name,
        key=step.key,
        status=status,
        seconds=time.time() - t0,
        metrics=metrics,
        iteration=step.iteration,
        stage=step.node.stage.name,
        finished=time.time(),
        placement=placement,
    )


class StepRunner:
    """Takes the steps of one spec's plan from, or into, one catalog."""

    def __init__(self, spec: Spec, catalog: Catalog, display: Display, ray: Callable[[], Any]) -> None:
        self.spec, self.catalog, self.display, self.ray = spec, catalog, display, ray
        self.producers: dict[str, Step] = {}  # result key -> the plan's step that makes it (set by the runner)
        self.placements: dict[str, str] = {}  # result key -> where the step that computed it ran (JSON), until taken
        self.verified: set[str] = set()  # results whose every byte was checked (or written) by this process
        self.events: Hooks | None = None  # where a result computed again is reported (set by the runner)
        self.stored: set[str] | None = None  # steps whose resident outputs are stored whole (None: all)
        self.holds = Holds(catalog.root)  # every key this run looked up, kept from `pipeline gc` (`release_holds`)

    def step(self, step: Step) -> tuple[str, dict[str, float]]:
        """(status, metrics) of one step: reused from earlier in this run, cached in
        the catalog, committed meanwhile by another process, or run now."""
        if step.reuses is not None:  # run at iteration `reuses` of this very run
            return "reused", self.catalog.manifest(step.key)["metrics"]
        found = self.sound(step.key)
        if found is not None:
            return "cached", found["metrics"]
        self.verify_inputs(step)
        return self.compute(step)

    def compute(self, step: Step) -> tuple[str, dict[str, float]]:
        """Run a step that is not in the catalog under its lease (or take the result
        another process committed while this one waited for the lease)."""
        lease = acquire(
            self.catalog.root,
            step.key,
            lambda: self.sound(step.key) is not None,
            on_wait=lambda owner: self.display.log(
                f"{step.label}: waiting for {owner.get('host')} pid {owner.get('pid')}, which is computing {step.key}"
            ),
            on_abandoned=lambda path: self.display.warn(
                f"{step.label}: lease {path} is empty or unreadable (its owner died while taking it): taking it over"
            ),
        )
        if lease is None:  # another process committed it while this one waited
            return "cached", self.catalog.manifest(step.key)["metrics"]
        lease.keep_fresh()
        try:
            return "ran", self._execute(step)
        finally:
            lease.release()

    def sound(self, key: str, full: bool = False) -> dict[str, Any] | None:
        """The manifest of `key` if it is committed and usable, else None. A result
        folder without a manifest, with an unreadable or malformed one, with files
        missing or of another size (with `full`: of another SHA-256), or marked
        damaged by `pipeline verify`, is reported, moved out of the catalog and
        computed again. The key is held first (`catalog.holds`): from here on
        `pipeline gc` keeps it."""
        root = self.catalog.root
        self.holds.hold(key)
        if not self.catalog.has(key):
            if root.is_local and root.exists("results", key):  # left without a manifest
                self.catalog.quarantine(key)
            return None
        manifest = None
        try:
            manifest = self.catalog.manifest(key)
            problems = self.catalog.check(key, full=full, manifest=manifest)
        except ManifestError as exc:
            problems = [str(exc).split(": ", 1)[-1]]
        marked = self.catalog.damage_mark(key)
        if marked is not None:
            problems.append(f"pipeline verify found: {marked}")
        if problems:
            self.display.warn(f"result {key}: {'; '.join(problems)}: computing it again")
            self.catalog.quarantine(key)
            return None
        return manifest

    def release_holds(self) -> None:
        """End this run's holds (when it ends: its record names what it used)."""
        self.holds.release()

    def read_keys(self, step: Step) -> list[str]:
        """The results `step` reads: its inputs and sources, and the results their
        selections point into."""
        keys = [parse_address(a)[0] for a in (*step.inputs.values(), *step.sources)]
        out: list[str] = []
        while keys:
            key = keys.pop()
            if key in out:
                continue
            out.append(key)
            with contextlib.suppress(CatalogError, ManifestError, FileNotFoundError):
                for o in self.catalog.manifest(key)["outputs"].values():
                    if o.get("selects"):
                        keys.append(parse_address(o["selects"])[0])
        return out

    def verify_inputs(self, step: Step) -> None:
        """Check every byte of the results `step` reads (module docstring); a damaged
        one is moved aside and computed again by its own step of the plan, reported to
        `events` as a step of its own. Call it on the thread that owns the hooks."""
        for key in self.read_keys(step):
            if key in self.verified:
                continue
            if self.sound(key, full=True) is None:  # said, and moved aside
                producer = self.producers.get(key)
                if producer is None:
                    raise CatalogError(
                        f"result {key}, read by {step.label}, is missing or was damaged (moved aside); run the pipeline "
                        "that made it again"
                    )
                t0 = time.time()
                if self.events is not None:
                    self.events.before_step(started(producer))
                status, metrics = self.step(producer)
                if self.events is not None:  # the run record names the new result, as `pipeline verify` expects
                    self.events.after_step(ended(producer, status, metrics, t0, self.placed(producer.key)))
            self.verified.add(key)

    def placed(self, key: str) -> str | None:
        """Where the step that computed `key` in this process ran, as JSON: a list of
        ``{role, index, node, host, rows}``, the driver first, then the engine actors
        or Ray Train workers the stage named (`StageContext.place`); None for a step
        this process did not run. Taken once."""
        return self.placements.pop(key, None)

    def _full(self, step: Step, written: int) -> CatalogFull:
        """The one line for a step whose result did not fit on the catalog's disk: what
        it had written, the free space, and what a result of its node took before (the
        best guess of what it needs)."""
        root = self.catalog.root
        free = ""
        if root.is_local:
            with contextlib.suppress(OSError):
                free = f", {_mib(shutil.disk_usage(root.path()).free)} free now"
        before = self._result_size(step.node.name)
        needed = f"about {_mib(before)}, what its last result took" if before > written else _mib(written)
        return CatalogFull(
            f"catalog {root.uri}: no space left on the device while {step.label} wrote its result "
            f"({_mib(written)} written when it failed{free}): it needs {needed}; free space "
            "(pipeline gc --apply removes what no run references) and run the same command to resume; "
            "nothing half-written was kept"
        )

    def _result_size(self, node: str) -> int:
        """Bytes of the largest committed result of pipeline node `node` (0: none)."""
        sizes = [0]
        for step in self.producers.values():
            if step.node.name == node and self.catalog.has(step.key):
                with contextlib.suppress(CatalogError, ManifestError, OSError):
                    sizes.append(sum(f["bytes"] for f in self.catalog.manifest(step.key).get("files", {}).values()))
        return max(sizes)

    def _warn(self, step: Step, message: str, metric: str, value: float) -> None:
        """A stage's warning: the display, and a row of the run's events (rule: the stage)."""
        self.display.warn(f"{step.label}: {message}")
        if self.events is not None:
            self.events.on_warning(
                Event(
                    iteration=step.iteration,  # type: ignore[arg-type]  # None: a once-stage
                    rule=step.node.stage.name,
                    metric=metric,
                    value=value,
                    reference=float("nan"),
                    threshold=float("nan"),
                    message=message,
                )
            )

    def _reporter(self, step: Step) -> Callable[[int, int, str], None]:
        """A step's `StageContext.progress`: to the hooks (the display, the run record),
        at most twice a second, and always the last of a count."""
        started, last = time.monotonic(), [0.0]

        def report(done: int, total: int, unit: str) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_EVERY and done < total:
                return
            last[0] = now
            progress = StepProgress(step.label, int(done), int(total), unit, now - started)
            (self.events.on_progress if self.events is not None else self.display.progress)(progress)

        return report

    def _shared(self, key: str) -> tuple[str, Any] | None:
        root = self.catalog.root
        return None if root.is_local else (root.path("_staging", "shared", key), root.fs)

    def _ref(self, address: str) -> Any:
        return self.catalog.at(address)

    def _execute(self, step: Step) -> dict[str, float]:
        writer = self.catalog.writer(step.key, step.node.stage.outputs)
        try:
            return self._compute_into(step, writer)
        except BaseException as exc:
            full = _disk_full(exc)
            written = _size(writer.staging) if full else 0
            writer.abort()
            if full:
                raise self._full(step, written) from exc
            if isinstance(exc, (KeyboardInterrupt, SystemExit, UserError)):  # a user mistake found at run time
                raise
            raise StageFailed(step.node.name, step.iteration, exc, traceback.format_exc()) from exc

    def _compute_into(self, step: Step, writer: ResultWriter) -> dict[str, float]:
        """Run `step`'s stage with its outputs staged in `writer` and commit them; an
        exception anywhere here (an interrupt among them) is `_execute`'s to clean up."""
        stage = step.node.stage
        places: list[dict[str, Any]] = []
        ctx = StageContext(
            run=self.spec.name,
            node=step.node.name,
            iteration=step.iteration,
            seed=self.spec.run.seed,
            key=step.key,
            _output_dir=writer.output_dir,
            _ray=self.ray,
            _log=self.display.log,
            sources=tuple(self._ref(a) for a in step.sources),
            _ref=self._ref,
            _shared=lambda: self._shared(step.key),
            _warn=lambda message, metric, value: self._warn(step, message, metric, value),
            _progress=self._reporter(step),
            _place=places.append,
            store=self.stored is None or step.key in self.stored,
        )
        t0 = time.time()
        refs = {p: self._ref(addr) for p, addr in step.inputs.items()}
        result = stage.fn(ctx, step.node.config, **refs)
        if not isinstance(result, StageResult):
            raise TypeError(f"stage '{stage.name}' returned {type(result).__name__}, not StageResult")
        metrics = {**{k: float(v) for k, v in result.metrics.items()}, "perf/seconds": time.time() - t0}
        stage.check_metrics(metrics)
        info = {
            "stage": stage.name,
            "version": stage.version,
            "code": stage.code,
            "node": step.node.name,
            "config": canonical(step.node.config),
            "inputs": dict(step.inputs),
            "seed": self.spec.run.seed,
            "iteration": step.iteration,
            "run": self.spec.name,
            "seconds": metrics["perf/seconds"],
        }
        writer.commit(result.tables, metrics, info)
        driver = {"role": "driver", "index": 0, **here(), "rows": None}
        self.placements[step.key] = json.dumps([driver, *places])
        self.verified.add(step.key)  # hashed as it was committed: read back in this run unchecked
        return metrics


def _disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is a full disk (ENOSPC)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _size(folder: Path) -> int:
    """Bytes of the files under `folder` (0 if it is gone)."""
    total = 0
    for p in Path(folder).rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
