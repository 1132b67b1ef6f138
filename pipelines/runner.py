"""The runner: walk the plan, skip what the catalog holds, run and commit the rest.

Running the same spec twice executes nothing the second time; after a change, only
the steps whose keys changed run; after a crash, the same command resumes from the
first step that has no committed result. Ray is started only when a stage asks for
it (`ctx.ray()`), so fully cached runs and Ray-free stages pay nothing for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from catalog.keys import canonical
from catalog.leases import acquire
from catalog.manifests import ManifestError
from catalog.store import Catalog
from catalog.views import write_views_sql
from common.errors import Interrupted, StageFailed, UserError
from pipelines.dag import build_graph
from pipelines.explain import recorded
from pipelines.hooks import HookList, Hooks, IterationCallback, RunEnd, RunLogHooks, RunStart, StepEvent, StepStart
from pipelines.plan import Step, plan
from pipelines.progress import Display, DisplayHooks, Quiet
from pipelines.select import Selection, select
from pipelines.spec import Spec, thaw
from pipelines.tracking import tracking_hooks
from pipelines.watch import WarningHooks
from stages.registry import StageContext, StageResult


@dataclass(frozen=True)
class RunSummary:
    """What a run did: steps executed and skipped, and its wall time."""

    run: str
    ran: int
    cached: int
    seconds: float
    left_out: int = 0  # steps a selection (`pipelines.select`) left out that are not in the catalog


class Signals:
    """While a run lasts, SIGINT and SIGTERM raise `Interrupted` in the main thread
    (Ray installs its own SIGTERM handler, which dumps native stacks and aborts: it
    is replaced again after Ray starts). Off the main thread (a sweep trial) the
    process's handlers are left alone."""

    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}
        self.received: int | None = None  # the last signal (Ray Tune re-raises a plain KeyboardInterrupt)

    def _raise(self, signum: int, frame: Any) -> None:
        self.received = signum
        raise Interrupted(signum)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._raise)
            self.saved.setdefault(signum, previous)

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        self.saved.clear()


def start_ray(address: str | None, **kwargs: Any) -> None:
    """`ray.init` as the runner and sweeps call it: connect to `address`, or start a
    local cluster. Ray's default of token authentication is kept; only its notice
    that it is on (a warning line in the middle of the run's display) is silenced."""
    import logging

    import ray

    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if address:
        kwargs["address"] = address
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **kwargs)


class _Ray:
    """Starts Ray on first use and shuts it down after the run if it started it."""

    def __init__(self, address: str | None, num_cpus: int | None, on_start: Callable[[], None] = lambda: None) -> None:
        self.address, self.num_cpus, self.started, self.on_start = address, num_cpus, False, on_start

    def __call__(self) -> None:
        import ray

        if ray.is_initialized():
            return
        address = self.address or os.environ.get("RAY_ADDRESS")
        try:
            start_ray(address, **({} if address else {"num_cpus": self.num_cpus}))
        except SystemExit as exc:  # Ray's own SIGTERM handler, installed while it starts, exits
            if exc.code in (signal.SIGTERM, int(signal.SIGTERM)):
                self.started = True  # what it had started is shut down with the run
                raise Interrupted(signal.SIGTERM) from None
            raise
        self.started = True
        self.on_start()

    def shutdown(self) -> None:
        if self.started:
            import ray

            ray.shutdown()


class Runner:
    """Runs one spec against one catalog (see the module docstring)."""

    def __init__(
        self,
        spec: Spec,
        catalog: Catalog,
        display: Display | None = None,
        ray_address: str | None = None,
        hooks: list[Hooks] | None = None,
        selection: Selection | None = None,
    ) -> None:
        self.spec, self.catalog = spec, catalog
        self.display = display or Quiet()
        self.hooks = list(hooks or [])  # the user's, after the built-in ones (`pipelines.hooks`)
        catalog.check_writable()
        self.signals = Signals()
        self.ray = _Ray(ray_address or spec.ray.address, spec.ray.num_cpus, self.signals.install)
        self.steps = plan(spec, build_graph(spec), catalog)
        self.wanted = select(self.steps, selection or Selection(), catalog.has)

    def run(self, on_iteration: Callable[[int, dict[str, float]], None] | None = None) -> RunSummary:
        """Run every step not in the catalog. `on_iteration(i, metrics)` is called as
        each iteration ends, with the latest value of every metric reported so far
        (once-stages and earlier iterations included, so an every-N eval's metric is
        present at each call): how a sweep trial reports progress."""
        spec, started = self.spec, time.time()
        hooks = HookList([])  # the warnings hook tells every hook, this list included
        hooks.hooks += [
            DisplayHooks(self.display),
            RunLogHooks(self.catalog.root),
            WarningHooks(spec.warnings, hooks.on_warning),
            *([IterationCallback(on_iteration)] if on_iteration is not None else []),
            *tracking_hooks(spec.tracking, self.catalog),
            *self.hooks,
        ]
        latest: dict[str, float] = {}
        current: dict[str, float] = {}  # this iteration's metrics
        hooks.before_run(
            RunStart(
                run=spec.name,
                spec_file=spec.file,
                settings=thaw(spec.resolved),
                spec_yaml=spec.resolved_yaml(),
                iterations=spec.run.iterations,
                seed=spec.run.seed,
                steps=len(self.steps),
                catalog=self.catalog.root.uri,
                recorded=recorded(spec),
            )
        )

        def end(status: str, message: str = "") -> None:
            hooks.after_run(RunEnd(run=spec.name, status=status, seconds=time.time() - started, message=message))

        ran = left_out = 0
        step_label = ""
        self.signals.install()
        try:
            for n, step in enumerate(self.steps):
                step_label = step.label
                t0 = time.time()
                if self.wanted[n]:
                    hooks.before_step(self._start(step))
                    status, metrics = self._step(step)
                else:
                    if step.reuses is None:
                        found = self._sound(step.key)
                    else:
                        found = self.catalog.manifest(step.key) if self.catalog.has(step.key) else None
                    if found is None:
                        left_out += 1
                        if step.iteration is not None and current and self._last_of_iteration(n):
                            hooks.after_iteration(step.iteration, dict(current), dict(latest))
                            current = {}
                        continue
                    status, metrics = ("cached" if step.reuses is None else "reused"), found["metrics"]
                    hooks.before_step(self._start(step))
                ran += status == "ran"
                hooks.after_step(
                    StepEvent(
                        label=step.label,
                        node=step.node.name,
                        key=step.key,
                        status=status,
                        seconds=time.time() - t0,
                        metrics=metrics,
                        iteration=step.iteration,
                        stage=step.node.stage.name,
                        finished=time.time(),
                    )
                )
                latest.update(metrics)
                current.update(metrics)
                ends = self._last_of_iteration(n)
                if step.iteration is not None and ends:
                    hooks.after_iteration(step.iteration, dict(current), dict(latest))
                if ends:
                    current = {}
        except KeyboardInterrupt as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            stopped = Interrupted(signum, step_label)
            hooks.on_error(stopped)
            end("interrupted", f"{signal.Signals(signum).name} at {step_label}")
            raise stopped from None
        except BaseException as exc:
            hooks.on_error(exc)
            end("failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.signals.restore()
            self.ray.shutdown()
            with contextlib.suppress(OSError):  # a catalog that turned read-only: the error says so already
                write_views_sql(self.catalog)
        seconds = time.time() - started
        end("finished")
        return RunSummary(spec.name, ran, len(self.steps) - ran - left_out, seconds, left_out)

    @staticmethod
    def _start(step: Step) -> StepStart:
        return StepStart(
            label=step.label, node=step.node.name, stage=step.node.stage.name, iteration=step.iteration, key=step.key
        )

    def _last_of_iteration(self, n: int) -> bool:
        """Whether step `n` is the last of its iteration (or of the once-stages)."""
        return n + 1 == len(self.steps) or self.steps[n + 1].iteration != self.steps[n].iteration

    def _step(self, step: Step) -> tuple[str, dict[str, float]]:
        """(status, metrics) of one step: reused from earlier in this run, cached in
        the catalog, committed meanwhile by another process, or run now."""
        if step.reuses is not None:  # run at iteration `reuses` of this very run
            return "reused", self.catalog.manifest(step.key)["metrics"]
        found = self._sound(step.key)
        if found is not None:
            return "cached", found["metrics"]
        lease = acquire(
            self.catalog.root,
            step.key,
            lambda: self._sound(step.key) is not None,
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

    def _sound(self, key: str) -> dict[str, Any] | None:
        """The manifest of `key` if it is committed and usable, else None. A result
        folder without a manifest, with an unreadable or malformed one, with files
        missing or of another size, or marked damaged by `pipeline verify`, is
        reported, moved out of the catalog and computed again."""
        root = self.catalog.root
        if not self.catalog.has(key):
            if root.is_local and root.exists("results", key):  # left without a manifest
                self.catalog.quarantine(key)
            return None
        manifest = None
        try:
            manifest = self.catalog.manifest(key)
            problems = self.catalog.check(key, manifest=manifest)
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

    def _shared(self, key: str) -> tuple[str, Any] | None:
        root = self.catalog.root
        return None if root.is_local else (root.path("_staging", "shared", key), root.fs)

    def _ref(self, address: str) -> Any:
        return self.catalog.at(address)

    def _execute(self, step: Step) -> dict[str, float]:
        stage = step.node.stage
        writer = self.catalog.writer(step.key, stage.outputs)
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
        )
        t0 = time.time()
        try:
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
            return metrics
        except BaseException as exc:
            writer.abort()
            if isinstance(exc, (KeyboardInterrupt, SystemExit, UserError)):  # a user mistake found at run time
                raise
            raise StageFailed(step.node.name, step.iteration, exc, traceback.format_exc()) from exc
