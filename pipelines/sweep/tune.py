"""Sweeps: a base pipeline, a search space over its dotted keys, run by Ray Tune.

A sweep file::

    sweep:
      base: starpo.yaml            # the pipeline every trial runs
      search: grid                 # grid (every point) | optuna (num_samples trials)
      metric: eval/success_rate    # any metric a stage reports; ranked by its last value
    overrides: {run.iterations: 10}
    space:
      rollout.online_k: {grid: [1, 2, 4]}
      update.optim.lr: {loguniform: [1.0e-5, 1.0e-3]}
      diversity:                   # a factor: each value sets several keys together
        grid:
          - {rollout.n_groups: 4, rollout.group_size: 32}
          - {rollout.n_groups: 8, rollout.group_size: 16}

Each trial is a pipeline run of `base` with the fixed overrides and its point's,
named ``<sweep>-<trial>`` (the trial id is a hash of its overrides), in the same
catalog: trials share every result whose key they share (the warm start, above
all). A trial reports its metrics after every iteration (`Runner.run`), so an
ASHA scheduler can stop it early. Every point is validated as a spec before
anything runs; where trials run at once, the shared once-stages are computed first,
one at a time, so that they do not build the same warm start twice (trials run one
at a time compute them as they come: a seed's pretraining with its first trial). Ended trials are
recorded in the catalog (`catalog.trials`, the `trials` view); running the same
sweep again skips every trial already recorded as finished or stopped (an
optuna search is told their results), so an interrupted sweep resumes; a recorded
trial whose run did not take the steps its point plans from the base spec and code as
they are now (the default changed since) runs again, its record moved aside (`outdated`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from catalog.store import Catalog
from catalog.trials import FINAL, TrialRecord, read_trials, supersede, write_base, write_trial
from pipelines.run.session import keep_ray as session_keeps_ray
from pipelines.sweep.file import Sweep, as_overrides, base_settings, check, check_metric, load_sweep, trial_spec

__all__ = ["Sweep", "check", "load_sweep", "print_trials", "ranked", "run_sweep", "trial_spec"]


def _report(iteration: int, metrics: dict[str, float]) -> None:
    from ray import tune

    tune.report({**metrics, "iteration": iteration})


def _trainable(config: dict[str, Any], sweep: Sweep, root: str) -> None:
    """One trial: the base pipeline with the trial's overrides, reporting per iteration."""
    import torch

    import stages  # noqa: F401  (registers the stages in the trial's process)
    from pipelines.run.progress import Quiet
    from pipelines.run.runner import Runner

    torch.set_num_threads(max(1, int(sweep.section.trial_cpus)))
    params = dict(config.get("_point", config))
    trial = sweep.trial_id(sweep.overrides_of(params))
    spec = trial_spec(sweep, params, trial)
    Runner(spec, Catalog(root), Quiet()).run(on_iteration=_report)


def outdated(sweep: Sweep, point: dict[str, Any], record: dict[str, Any], catalog: Catalog) -> bool:
    """Whether the recorded trial of `point` is not what the point would run now: some step
    of the iterations it reported (and every once-stage), planned from the base spec and code
    as they are, is not a step its run took (the run's latest invocation). A changed default,
    stage code or fixed override changes those keys; a trial of the same spec took them all.
    (Whether the catalog holds them says nothing: another run may have made them.)"""
    from catalog.runs import read_steps
    from pipelines.graph.dag import build_graph
    from pipelines.graph.plan import plan

    taken = read_steps(catalog.root, str(record["run"]))
    if taken is None:
        return True
    keys = set(taken.column("key").to_pylist())
    spec = trial_spec(sweep, point, str(record["trial"]))
    reported = int(record.get("iterations") or 0)
    steps = plan(spec, build_graph(spec), catalog)
    return not all(st.key in keys for st in steps if st.iteration is None or st.iteration < reported)


def recorded(overrides: dict[str, Any]) -> str:
    """A trial's overrides as its record keeps them (`TrialRecord.overrides`), the form a
    resumed sweep compares its points with."""
    return json.dumps(overrides, sort_keys=True)


class _Recorder:
    """A Ray Tune callback (built by `_recorder`) that writes each ended trial's record."""

    def __init__(self, sweep: Sweep, catalog: Catalog, echo: Callable[[str], None]) -> None:
        self.sweep, self.catalog, self.echo = sweep, catalog, echo
        self.started: dict[str, float] = {}
        self.best: dict[str, float] = {}
        self.done = 0

    def start(self, trial: Any) -> None:
        self.started[trial.trial_id] = time.time()

    def result(self, trial: Any, result: dict[str, Any]) -> None:
        value = result.get(self.sweep.section.metric)
        if isinstance(value, (int, float)):
            old = self.best.get(trial.trial_id)
            better = max if self.sweep.section.mode == "max" else min
            self.best[trial.trial_id] = value if old is None else better(old, value)

    def end(self, trial: Any, error: str | None) -> None:
        params = dict(trial.config.get("_point", trial.config))
        overrides = self.sweep.overrides_of(params)
        tid = self.sweep.trial_id(overrides)
        last = trial.last_result or {}
        planned = trial_spec(self.sweep, params, tid).run.iterations
        reported = int(last["iteration"]) + 1 if "iteration" in last else 0
        status = "failed" if error else "finished" if reported >= planned else "stopped"
        value = last.get(self.sweep.section.metric)
        record = TrialRecord(
            sweep=self.sweep.name,
            trial=tid,
            run=f"{self.sweep.name}-{tid}",
            status=status,
            params=json.dumps(params, sort_keys=True),
            overrides=recorded(overrides),
            metric=self.sweep.section.metric,
            value=float(value) if isinstance(value, (int, float)) else None,
            best=self.best.get(trial.trial_id),
            iterations=reported,
            seconds=time.time() - self.started.get(trial.trial_id, time.time()),
            error=error,
        )
        write_trial(self.catalog.root, record)
        self.done += 1
        shown = "-" if record.value is None else f"{record.value:.4g}"
        self.echo(
            f"  trial {tid} {status:<8} {self.sweep.section.metric}={shown}  {record.seconds:6.1f}s  "
            f"{_brief(self.sweep, overrides)}"
        )


def _recorder(recorder: _Recorder, check_signals: Callable[[], None]) -> Any:
    """The callback Ray Tune calls: the trial records, and `check_signals` once a step of Tune's
    loop (in the main thread: a signal whose interrupt was dropped ends the sweep there).
    Both are the instance's, not the class's closure: Tune pickles its callbacks, and
    cloudpickle, loading a class defined here in the process that made it, sets the
    loaded copy's methods on the class itself."""
    from ray import tune

    class Recorder(tune.Callback):
        def __init__(self) -> None:
            self.recorder, self.check_signals = recorder, check_signals

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            self.check_signals()

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.recorder.start(trial)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self.recorder.result(trial, result)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.recorder.end(trial, None)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.recorder.end(trial, str(getattr(trial, "error_msg", None) or "the trial raised"))

    return Recorder()


def _brief(sweep: Sweep, overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in overrides.items() if sweep.fixed.get(k, object()) != v)


def _concurrency(sweep: Sweep) -> int:
    import ray

    if sweep.section.max_concurrent_trials:
        return sweep.section.max_concurrent_trials
    cpus = ray.cluster_resources().get("CPU", os.cpu_count() or 1)
    return max(1, int(cpus // sweep.section.trial_cpus))


def _prewarm(sweep: Sweep, catalog: Catalog, points: list[dict[str, Any]], echo: Callable[[str], None]) -> None:
    """Compute the once-stages the trials share, one distinct set at a time."""
    from pipelines.graph.load import load_spec
    from pipelines.run.progress import Quiet
    from pipelines.run.runner import Runner

    seen: set[tuple[str, ...]] = set()
    for params in points or [sweep.first_point()]:
        overrides = (*as_overrides(sweep.overrides_of(params)), f"run.name={sweep.name}-shared", "run.iterations=0")
        runner = Runner(load_spec(sweep.base, overrides), catalog, Quiet())
        keys = tuple(s.key for s in runner.steps)
        if keys in seen or all(catalog.has(k) for k in keys):
            seen.add(keys)
            continue
        seen.add(keys)
        t0 = time.time()
        runner.run()
        echo(f"  shared once-stages computed in {time.time() - t0:.1f}s ({len(keys)} steps)")


def run_sweep(
    sweep: Sweep,
    catalog: Catalog,
    echo: Callable[[str], None] = print,
    address: str | None = None,
    on_ray_start: Callable[[], None] = lambda: None,
    check_signals: Callable[[], None] = lambda: None,
    keep_ray: bool | None = None,
) -> list[dict[str, Any]]:
    """Run the trials not yet recorded; return every trial record of the sweep, best
    first. `on_ray_start` is called once Ray has started (signal handlers go back on);
    `check_signals` at every step of Ray Tune's loop (it raises a signal's interrupt that was
    received but dropped where it was raised: `pipelines.run.session.Signals.check`);
    `keep_ray`: as a `Runner`'s."""
    import ray

    points = check(sweep)
    check_metric(sweep, trial_spec(sweep, points[0] if points else sweep.first_point(), "check"))
    write_base(catalog.root, sweep.name, Path(sweep.base).name, base_settings(sweep))
    done = {r["trial"]: r for r in read_trials(catalog.root, sweep.name) if r["status"] in FINAL}
    # a point is done when a trial of its overrides ended (not by trial id: the id also holds the base
    # spec's path, which differs in another checkout of the same project on the same catalog) and
    # that trial's run took the steps the point plans now; every other record of it is stale (`outdated`)
    ended: dict[str, list[dict[str, Any]]] = {}
    for r in done.values():
        ended.setdefault(r["overrides"], []).append(r)
    todo, stale = [], []
    for p in points:
        records = ended.get(recorded(sweep.overrides_of(p)), [])
        old = [r["trial"] for r in records if outdated(sweep, p, r, catalog)]
        stale += old
        if len(old) == len(records):
            todo.append(p)
    if stale:
        echo(
            f"sweep {sweep.name}: {len(stale)} recorded trial(s) ran another base spec or code than this one "
            f"({', '.join(sorted(stale))}): run again (steps whose keys did not change are reused); their records "
            f"moved to sweeps/{sweep.name}/superseded/"
        )
        done = {t: r for t, r in done.items() if t not in stale}
        for trial in stale:
            supersede(catalog.root, sweep.name, trial)
    wanted = len(todo) if points else max(0, sweep.section.num_samples - len(done))
    echo(f"sweep {sweep.name}: {wanted} trial(s) to run, {len(done)} already recorded, catalog {catalog.root.uri}")
    if wanted:
        started = not ray.is_initialized()
        if started:  # one Ray session for the shared stages and the trials
            from pipelines.run.session import start_ray

            start_ray(address or os.environ.get("RAY_ADDRESS"))
            on_ray_start()
        try:
            if _concurrency(sweep) > 1:  # one at a time, each trial computes what it needs, when it needs it
                _prewarm(sweep, catalog, todo, echo)
            _tune(sweep, catalog, todo, list(done.values()), wanted, echo, check_signals)
        finally:
            if started and not (keep_ray if keep_ray is not None else session_keeps_ray()):
                ray.shutdown()
    return ranked(sweep, catalog)


def _tune(
    sweep: Sweep,
    catalog: Catalog,
    todo: list[dict[str, Any]],
    done: list[dict[str, Any]],
    wanted: int,
    echo: Callable[[str], None],
    check_signals: Callable[[], None],
) -> None:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    s = sweep.section
    # A trial reserves next to no CPU of its own: the Ray Data and Ray Train tasks it starts need
    # the CPUs, and a trial holding one would starve them. max_concurrent_trials bounds
    # how many run at once, and each trial's torch uses trial_cpus threads.
    trainable = tune.with_resources(tune.with_parameters(_trainable, sweep=sweep, root=catalog.root.uri), {"cpu": 0.01})
    if todo:
        space: dict[str, Any] = {"_point": tune.grid_search(todo)}
        search = None
        samples = 1
    else:
        from ray.tune.search.optuna import OptunaSearch

        space = {d.name: d.tune_domain() for d in sweep.space}
        finished = [r for r in done if r["value"] is not None]
        search = OptunaSearch(
            metric=s.metric,
            mode=s.mode,
            seed=s.seed,
            points_to_evaluate=[json.loads(r["params"]) for r in finished] or None,
            evaluated_rewards=[r["value"] for r in finished] or None,
        )
        samples = wanted
    planned = trial_spec(sweep, todo[0] if todo else sweep.first_point(), "check")
    scheduler = None
    if s.asha is not None:
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=planned.run.iterations,
            grace_period=s.asha.grace_period,
            reduction_factor=s.asha.reduction_factor,
        )
    recorder = _Recorder(sweep, catalog, echo)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the trial lines come from the recorder
    # Tune's own files: an interrupted sweep's writers may still be at work while the folder goes
    with tempfile.TemporaryDirectory(prefix="sweep-", ignore_cleanup_errors=True) as storage:
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=s.metric,
                mode=s.mode,
                search_alg=search,
                scheduler=scheduler,
                num_samples=samples,
                max_concurrent_trials=_concurrency(sweep),
                reuse_actors=True,  # one trial process for the next: not its interpreter and imports again
            ),
            run_config=tune.RunConfig(
                name=sweep.name, storage_path=storage, verbose=0, callbacks=[_recorder(recorder, check_signals)]
            ),
        )
        tuner.fit()


def ranked(sweep: Sweep, catalog: Catalog) -> list[dict[str, Any]]:
    """The sweep's trial records, best first (failed and metric-less trials last)."""
    rows = read_trials(catalog.root, sweep.name)
    sign = -1.0 if sweep.section.mode == "max" else 1.0
    return sorted(
        rows, key=lambda r: (r["value"] is None or r["status"] == "failed", sign * (r["value"] or 0.0), r["trial"])
    )


def print_trials(sweep: Sweep, rows: list[dict[str, Any]], echo: Callable[[str], Any]) -> None:
    """The trials ranked as a table, then the command that reruns the best one."""
    from rich.console import Console
    from rich.table import Table

    from common.terminal import terminal_width

    out = Table()
    for c in ("rank", "trial", "status", sweep.section.metric, "best", "iterations", "seconds", "overrides"):
        out.add_column(c, overflow="fold")
    for i, r in enumerate(rows, 1):
        varied = {k: v for k, v in json.loads(r["overrides"]).items() if sweep.fixed.get(k, object()) != v}
        out.add_row(
            str(i),
            r["trial"],
            r["status"],
            "" if r["value"] is None else f"{r['value']:.4g}",
            "" if r["best"] is None else f"{r['best']:.4g}",
            str(r["iterations"]),
            f"{r['seconds']:.1f}",
            " ".join(f"{k}={json.dumps(v)}" for k, v in varied.items()),
        )
    Console(width=terminal_width()).print(out)
    best = next((r for r in rows if r["status"] != "failed" and r["value"] is not None), None)
    if best is not None:
        flags = " ".join(f"-o '{k}={json.dumps(v)}'" for k, v in json.loads(best["overrides"]).items())
        echo(f"best: trial {best['trial']} (run {best['run']}): pipeline run {Path(sweep.base).name} {flags}")
