"""The runner: walk the plan, skip what the catalog holds, run and commit the rest.

Running the same spec twice executes nothing the second time; after a change, only
the steps whose keys changed run; after a crash, the same command resumes from the
first step that has no committed result. Ray is started only when a stage asks for
it (`ctx.ray()`), so fully cached runs and Ray-free stages pay nothing for it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from catalog.store import Catalog
from catalog.views import write_views_sql
from common import live, machine
from common.errors import Interrupted, UserError
from pipelines.graph import resources
from pipelines.graph.dag import build_graph, preflight
from pipelines.graph.plan import dependencies, plan, stored
from pipelines.graph.select import Selection, select
from pipelines.run.hooks import HookList, Hooks, IterationCallback, RunEnd, RunLogHooks, RunStart
from pipelines.run.progress import Display, DisplayHooks, Quiet
from pipelines.run.session import Signals, _Ray
from pipelines.run.session import keep_ray as session_keeps_ray
from pipelines.run.steps import StepRunner, ended, started
from pipelines.run.tracking import tracking_hooks
from pipelines.run.watch import WarningHooks
from pipelines.spec.build import Spec, thaw
from pipelines.spec.explain import recorded


@dataclass(frozen=True)
class RunSummary:
    """What a run did: steps executed and skipped, and its wall time."""

    run: str
    ran: int
    cached: int
    seconds: float
    left_out: int = 0  # steps a selection (`pipelines.graph.select`) left out that are not in the catalog


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
        keep_ray: bool | None = None,
    ) -> None:
        """`keep_ray`: leave a local Ray session this run starts up after it (None:
        ``PIPELINE_KEEP_RAY``, `pipelines.run.session.keep_ray`)."""
        self.spec, self.catalog = spec, catalog
        self.display = display or Quiet()
        self.hooks = list(hooks or [])  # the user's, after the built-in ones (`pipelines.run.hooks`)
        catalog.check_writable()
        self.signals = Signals()
        keep = keep_ray if keep_ray is not None else session_keeps_ray()
        self.ray = _Ray(ray_address or spec.ray.address, spec.ray.num_cpus, self._ray_started, keep)
        self.work = StepRunner(spec, catalog, self.display, self.ray)
        self.steps = plan(spec, build_graph(spec), catalog)
        self.work.producers = {s.key: s for s in self.steps if s.reuses is None}
        self.wanted = select(self.steps, selection or Selection(), catalog.has)
        self.work.stored = stored(self.steps, self.wanted)
        preflight(spec, [s for s, w in zip(self.steps, self.wanted, strict=True) if w], catalog.has)
        nodes = {s.node.name: s.node for s, w in zip(self.steps, self.wanted, strict=True) if w}
        self.resources = resources.of_nodes(nodes.values(), spec.run.concurrency)

    def run(self, on_iteration: Callable[[int, dict[str, float]], None] | None = None) -> RunSummary:
        """Run every step not in the catalog. `on_iteration(i, metrics)` is called as
        each iteration ends, with the latest value of every metric reported so far
        (once-stages and earlier iterations included, so an every-N eval's metric is
        present at each call): how a sweep trial reports progress."""
        spec, started = self.spec, time.time()
        machine.pin_threads()
        try:
            self._check_resources()
        except BaseException:  # refused before any step: a Ray session it started goes too
            self.ray.shutdown()
            raise
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
        self.work.events = hooks
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

        self.label = ""  # the step an interrupt names
        self.signals.install()
        owner = live.scope(spec.name)  # the run's live state (`common.live`), closed below however the run ends
        owner.__enter__()
        failed = True  # until the steps are done: what the finally below may not replace
        try:
            at_once = spec.run.concurrency > 1
            ran, left_out = (self._at_once if at_once else self._in_order)(hooks, latest)
            failed = False
        except KeyboardInterrupt as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            stopped = Interrupted(signum, self.label)
            hooks.on_error(stopped)
            end("interrupted", f"{signal.Signals(signum).name} at {self.label}")
            raise stopped from None
        except BaseException as exc:
            hooks.on_error(exc)
            end("failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.signals.restore()
            # the trainer, critic, engine host, servers' health: every version a later run reads is
            # stored, or rebuilt from its recipe
            closing: BaseException | None = None
            try:
                owner.__exit__(None, None, None)
            except BaseException as exc:  # a slot that failed to close (the others were closed)
                closing = exc
            finally:
                self.ray.shutdown()
                self.work.release_holds()
            with contextlib.suppress(OSError):  # a catalog that turned read-only: the error says so already
                write_views_sql(self.catalog)
            if closing is not None:
                said = f"closing the run's live state: {type(closing).__name__}: {closing}"
                if failed:  # the run's own error stays the one raised; this one is said beside it
                    self.display.warn(said)
                else:  # the run record ends, failed, with it
                    hooks.on_error(closing)
                    end("failed", said)
                    raise closing
        seconds = time.time() - started
        end("finished")
        return RunSummary(spec.name, ran, len(self.steps) - ran - left_out, seconds, left_out)

    def _in_order(self, hooks: HookList, latest: dict[str, float]) -> tuple[int, int]:
        """Walk the plan one step at a time; (steps run, steps left out)."""
        ran = left_out = 0
        current: dict[str, float] = {}  # this iteration's metrics
        for n, step in enumerate(self.steps):
            self.signals.check()
            self.label = step.label
            t0 = time.time()
            if self.wanted[n]:
                hooks.before_step(started(step))
                status, metrics = self.work.step(step)
            else:
                if step.reuses is None:
                    found = self.work.sound(step.key)
                else:
                    found = self.catalog.manifest(step.key) if self.catalog.has(step.key) else None
                if found is None:
                    left_out += 1
                    if step.iteration is not None and current and self._last_of_iteration(n):
                        hooks.after_iteration(step.iteration, dict(current), dict(latest))
                        current = {}
                    continue
                status, metrics = ("cached" if step.reuses is None else "reused"), found["metrics"]
                hooks.before_step(started(step))
            ran += status == "ran"
            hooks.after_step(ended(step, status, metrics, t0, self.work.placed(step.key)))
            latest.update(metrics)
            current.update(metrics)
            ends = self._last_of_iteration(n)
            if step.iteration is not None and ends:
                hooks.after_iteration(step.iteration, dict(current), dict(latest))
            if ends:
                current = {}
        return ran, left_out

    def _at_once(self, hooks: HookList, latest: dict[str, float]) -> tuple[int, int]:
        """Run every step whose inputs are committed, up to ``run.concurrency`` at once
        and one per host (`StageDef.host_of`); (steps run, steps left out).

        Steps compute in worker threads; the catalog checks, the hooks and the run
        record stay on this thread, so each step's events keep their order and an
        iteration ends (`after_iteration`) once all its steps and all earlier
        iterations are done. A failure or an interrupt stops new steps, waits for those
        in flight (they commit as they would alone), then ends the run as failed or
        interrupted; a second interrupt stops the wait."""
        from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

        steps, deps = self.steps, dependencies(self.steps)
        hosts = [s.node.stage.host_of(s.node.config) for s in steps]
        order = list(dict.fromkeys(s.iteration for s in steps))  # once-stages (None) first
        left = {it: sum(s.iteration == it for s in steps) for it in order}
        current: dict[int | None, dict[str, float]] = {it: {} for it in order}
        touched: set[int | None] = set()  # iterations with a step not left out
        done: set[int] = set()
        pending = list(range(len(steps)))
        running: dict[Future[tuple[str, dict[str, float]]], tuple[int, float]] = {}
        ran = left_out = 0
        stop: BaseException | None = None

        def finish(n: int, status: str | None, metrics: dict[str, float], t0: float) -> None:
            nonlocal ran
            step = steps[n]
            done.add(n)
            left[step.iteration] -= 1
            if status is not None:
                ran += status == "ran"
                touched.add(step.iteration)
                hooks.after_step(ended(step, status, metrics, t0, self.work.placed(step.key)))
                latest.update(metrics)
                current[step.iteration].update(metrics)
            while order and left[order[0]] == 0:
                it = order.pop(0)
                if it is not None and it in touched:
                    hooks.after_iteration(it, dict(current[it]), dict(latest))

        with ThreadPoolExecutor(max_workers=self.spec.run.concurrency, thread_name_prefix="step") as pool:
            while pending or running:
                if stop is None and self.signals.received is not None:  # a signal whose interrupt was lost
                    stop = Interrupted(self.signals.received)
                    self.display.warn("interrupted: waiting for the steps in flight to commit (again to stop now)")
                before = len(pending)
                busy = {hosts[n] for n, _ in running.values()}
                for n in list(pending) if stop is None else []:
                    step = steps[n]
                    if not deps[n] <= done:
                        continue
                    t0 = time.time()
                    if step.reuses is not None:  # executed at an earlier iteration of this run
                        found = self.catalog.manifest(step.key) if self.catalog.has(step.key) else None
                    else:
                        found = self.work.sound(step.key)
                    if found is not None or not self.wanted[n]:
                        pending.remove(n)
                        if found is None:  # not selected, not in the catalog
                            left_out += 1
                            finish(n, None, {}, t0)
                            continue
                        hooks.before_step(started(step))
                        finish(n, "cached" if step.reuses is None else "reused", found["metrics"], t0)
                        continue
                    if hosts[n] in busy or len(running) >= self.spec.run.concurrency:
                        continue
                    self.ray()  # started here, on the main thread, before the first step computes
                    self.work.verify_inputs(step)  # here too: it may compute a damaged input again
                    pending.remove(n)
                    busy.add(hosts[n])
                    self.label = step.label
                    hooks.before_step(started(step))
                    running[pool.submit(live.bound(self.work.compute), step)] = (n, t0)
                if not running:
                    if stop is not None or not pending:
                        break
                    if len(pending) == before:  # cannot happen: a step's producers come before it
                        raise RuntimeError(f"no step can start: {[steps[n].label for n in pending[:3]]} wait")
                    continue  # steps were taken from the catalog: look again
                try:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                except KeyboardInterrupt as exc:
                    if stop is not None:
                        raise
                    stop = exc
                    self.display.warn("interrupted: waiting for the steps in flight to commit (again to stop now)")
                    continue
                for future in finished:
                    n, t0 = running.pop(future)
                    error = future.exception()
                    if error is not None:
                        stop = stop or error
                        continue
                    status, metrics = future.result()
                    finish(n, status, metrics, t0)
        if stop is not None:
            raise stop
        return ran, left_out

    def _check_resources(self) -> None:
        """Refuse, in one line and before any step, a run whose stages would hold more of
        the cluster at once than it has (`pipelines.graph.resources`): Ray would wait for
        them without end. A plan that holds GPUs starts Ray to ask (the check runs as Ray
        starts, before the engine actors are asked for: `_ray_started`); one that holds
        none is checked where Ray is already up, else when a stage starts it."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            self._fits()
        elif self.resources.gpus:
            self.ray()

    def _fits(self) -> None:
        import ray

        where = f"the Ray cluster at {self.ray.address}" if self.ray.address else "this machine's Ray session"
        resources.check(self.resources, ray.cluster_resources(), where)

    def _ray_started(self) -> None:
        """Once Ray is up: take SIGINT/SIGTERM back from Ray, and start the engine actors
        of the first step played on them (a rollout or eval with ``actors >= 1``), so
        that their start (about 10 s here) overlaps the steps before it, e.g. the warm
        start, instead of delaying that step. Creating an actor returns at once."""
        self.signals.install()
        self._fits()
        for step in self.steps:
            cfg = step.node.config
            if step.node.stage.host_of(cfg) == "engine" and hasattr(cfg, "engine_settings"):
                from stages.engines.hosts import ray_pool

                s = cfg.engine_settings()
                with contextlib.suppress(UserError):  # settings the cluster cannot take: that step says so
                    ray_pool(s.engine, s.actors, s.actor_cpus, s.actor_gpus, s.options)
                return

    def _last_of_iteration(self, n: int) -> bool:
        """Whether step `n` is the last of its iteration (or of the once-stages)."""
        return n + 1 == len(self.steps) or self.steps[n + 1].iteration != self.steps[n].iteration
