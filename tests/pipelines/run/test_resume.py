"""Resume, verified at many points of a small real LM pipeline (warm start, eval,
rollout, filter, advantage, update; 2 iterations): a process dies, the same run is
started again, and it ends with the uninterrupted run's result keys and a
byte-identical final checkpoint.

Deaths are real: `os._exit` at a chosen point in a fresh interpreter (forked from a
fork server that has imported the project and run nothing; inside a
stage, between writing a result and renaming it, while writing a manifest, during
the run record, ...), and SIGKILL of a `pipeline run` process at three stages (the
console script's `main`, forked from the same fork server: `Command`)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from pathlib import Path

import pytest

from catalog.store import Catalog
from pipelines.graph.load import load_spec
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from tests.conftest import ACROSS_PROCESSES, SMALL_DEFAULT

#: the small default spec, in this process (no engine actors), keeping every group
SMALL = ["run.iterations=2", *SMALL_DEFAULT, "rollout.actors=0", "eval.actors=0", "filter.drop_zero_std=false"]


def run(root: Path) -> list[str]:
    """Run the small pipeline in `root`; the keys of its steps, in order."""
    runner = Runner(load_spec("starpo.yaml", SMALL), Catalog(str(root)), Quiet())
    runner.run()
    return [s.key for s in runner.steps]


def final_checkpoint(root: Path, keys: list[str]) -> dict[str, bytes]:
    last = [k for k in keys if k.startswith("update-")][-1]
    folder = root / "results" / last / "policy"
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[str], dict[str, bytes]]:
    root = tmp_path_factory.mktemp("reference")
    keys = run(root)
    return keys, final_checkpoint(root, keys)


def _die(module: str, name: str, nth: int, before: bool, match: str = "") -> None:
    """Replace module.name with a wrapper whose nth call (counting the calls whose
    arguments mention `match`) ends the process, before or after doing its work."""
    import importlib

    owner: object = importlib.import_module(module)
    for part in name.split(".")[:-1]:
        owner = getattr(owner, part)
    attr = name.split(".")[-1]
    original = getattr(owner, attr)
    calls = [0]

    def wrapper(*args, **kwargs):
        if match and match not in repr((args, kwargs)):
            return original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == nth and before:
            os._exit(77)
        out = original(*args, **kwargs)
        if calls[0] == nth:
            os._exit(77)
        return out

    setattr(owner, attr, wrapper)


def _dying_run(root: str, point: tuple[str, str, int, bool, str]) -> None:
    _die(*point)
    run(Path(root))
    os._exit(0)  # the point was never reached


#: (what, module, attribute, which call, before the call (else after it), a text its arguments hold), in
#: the order a run meets them: each process dies at its point, and the next one resumes the run from
#: what it left (the call is counted in that process: the steps already committed are not run again)
POINTS = [
    ("inside the warm start", "stages.training.sft", "fine_tune", 1, True, ""),
    ("between writing a result and renaming it", "os", "rename", 1, True, "results"),
    ("after renaming a result, before recording the step", "os", "rename", 1, False, "results"),
    ("while writing a manifest", "pathlib", "Path.write_text", 1, True, "manifest.json"),
    ("inside the eval stage", "stages.eval", "env_metrics", 1, True, ""),
    ("while writing a result's metrics", "catalog.store", "pq.write_table", 1, True, "metrics.parquet"),
    ("during the run record of a step", "catalog.runs", "RunLog.add_step", 1, True, ""),
    ("inside the rollout stage", "stages.agent.play", "play_batch", 1, True, ""),
    ("inside the advantage stage", "stages.advantage", "compute", 1, True, ""),
    ("inside the update's training loop", "stages.training.loops", "_actor_micro_batch", 2, True, ""),
    ("during the run record's end", "catalog.runs", "RunLog.finish", 1, True, ""),
    ("while writing views.sql", "pipelines.run.runner", "write_views_sql", 1, True, ""),
]


#: what every dying process imports before its run: the fork server imports it once (a fresh
#: interpreter, as spawn's, that has run nothing), and each process is forked from it. Past the
#: project, the heavy packages a run imports on its way (about 2,000 modules: Ray Train and Data,
#: pandas, sympy through torch's compiler, boto3), so that 12 processes do not import them 12 times
PRELOAD = [
    "torch",
    "transformers",
    "stages",
    "pipelines.run.runner",
    "tests.pipelines.run.test_resume",
    "ray.train.torch",
    "ray.data",
    "pandas",
    "sympy",
    "accelerate",
    "boto3",
    "torch._dynamo",
    "transformers.generation",
    "tests.pipelines.run.forkserver_warm",
]


def _forkserver() -> BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@pytest.fixture(scope="module")
def fresh_process() -> BaseContext:
    """A multiprocessing context whose processes start as fresh interpreters with the
    project imported (a fork server)."""
    return _forkserver()


def _cli_main(args: list[str], cwd: str, env: dict[str, str], err: str) -> None:
    import tempfile

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # from $TMPDIR as now set
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    sys.argv = ["pipeline", *args]
    from pipelines.cli.main import main

    main()  # leaves the process with the command's exit status


class Command:
    """``pipeline ARGS`` as its own process, forked from the fork server (`fresh_process`):
    the console script's `main` with its own working directory, environment and stderr
    (into `err`), killed as any process is, without the interpreter's start and the
    ~6 s of imports a new `pipeline` process spends before its run."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], err: Path) -> None:
        self.args, self.err = args, err
        self.proc = _forkserver().Process(target=_cli_main, args=(args, str(cwd), env, str(err)))
        self.proc.start()

    def poll(self) -> int | None:
        return self.proc.exitcode

    def kill(self) -> None:
        if self.proc.pid is not None and self.proc.exitcode is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)

    def wait(self, timeout: float) -> int | None:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            self.kill()
            raise AssertionError(f"pipeline {' '.join(self.args)} did not end within {timeout:g} s")
        return self.proc.exitcode

    def said(self) -> str:
        return self.err.read_text(errors="replace")[-3000:]


def test_a_death_at_any_point_resumes_to_the_same_result(tmp_path, reference, fresh_process):
    """One run, killed at every point in turn: each death leaves the catalog to the next
    process, and the last one, undisturbed, ends with the reference's keys and final
    checkpoint byte for byte (a resume that trusted a half-written result would not)."""
    for what, *point in POINTS:
        child = fresh_process.Process(target=_dying_run, args=(str(tmp_path), tuple(point)))
        child.start()
        child.join(300)
        assert child.exitcode == 77, f"the process did not die {what}"
    keys = run(tmp_path)
    assert keys == reference[0]
    assert final_checkpoint(tmp_path, keys) == reference[1]


def _killed_and_resumed(
    tmp_path: Path, overrides: list[str], until: Callable[[Path], bool], resume: bool = True
) -> Path:
    """A `pipeline run` of starpo.yaml with `overrides` into ``tmp_path/cat``, SIGKILLed once
    `until(results folder)` holds (a run that ends first must have been told to: `until`
    never holds), then, if `resume`, the same command run to its end; the results folder."""
    env = {**os.environ, "PIPELINE_CATALOG": str(tmp_path / "cat")}
    command = ["run", "starpo.yaml", *[a for o in overrides for a in ("-o", o)]]
    log = tmp_path / f"run-{len(list(tmp_path.glob('run-*.err')))}.err"  # what the run said, should it fail
    proc = Command(command, tmp_path, env, log)
    results = tmp_path / "cat" / "results"
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline and not until(results):
        time.sleep(0.02)
    ended = proc.poll() is not None
    proc.kill()
    if ended:
        assert proc.poll() == 0, f"the run failed (exit {proc.poll()}):\n{proc.said()}"
        assert not until(results), "the process ended before the point it was to be killed at"
        return results
    assert until(results), "the process was killed before its point"
    if resume:
        again = Command(command, tmp_path, env, tmp_path / "resumed.err")
        assert again.wait(300) == 0, again.said()
    return results


@ACROSS_PROCESSES
def test_sigkill_of_a_pipeline_run_resumes_to_the_same_result(tmp_path, reference):
    """`pipeline run` SIGKILLed once the warm start is committed, the same command killed again
    once a rollout is, and again once an update is; the fourth ends the run: the reference's
    keys and final checkpoint."""
    for when in ("warmstart-", "rollout-", "update-"):
        _killed_and_resumed(tmp_path, SMALL, lambda results, w=when: any(results.glob(f"{w}*/manifest.json")), False)
    _killed_and_resumed(tmp_path, SMALL, lambda results: False, True)
    keys = run(tmp_path / "cat")  # everything cached now: the run's keys
    assert keys == reference[0]
    assert final_checkpoint(tmp_path / "cat", keys) == reference[1]


#: four iterations, the policy stored every third version: versions 1 and 2 stay in the trainer's memory
BETWEEN = [*[o for o in SMALL if o != "run.iterations=2"], "run.iterations=4", "update.checkpoint_every=3"]


class TestBetweenCheckpoints:
    """A class of its own: a unit `pytest --dist loadscope` can hand to another worker."""

    @ACROSS_PROCESSES
    def test_sigkill_between_two_checkpoints_resumes_to_the_run_that_stores_every_version(self, tmp_path):
        """The process dies after two updates whose versions were never stored: the resumed
        run rebuilds them from the warm start and their batches, and ends with the result
        keys and the final checkpoint, byte for byte, of a run that stores every version."""
        every = Runner(
            load_spec("starpo.yaml", [*BETWEEN, "update.checkpoint_every=1"]), Catalog(str(tmp_path / "ref")), Quiet()
        )
        every.run()
        ref_keys = [s.key for s in every.steps]
        in_memory: list[Path] = []

        def two_updates(results: Path) -> bool:  # and both kept only in memory when it died
            in_memory[:] = [m.parent / "policy" / "resident.json" for m in results.glob("update-*/manifest.json")]
            return len(in_memory) >= 2

        _killed_and_resumed(tmp_path, BETWEEN, two_updates)
        assert len(in_memory) == 2 and all(path.is_file() for path in in_memory)
        resumed = Runner(load_spec("starpo.yaml", BETWEEN), Catalog(str(tmp_path / "cat")), Quiet())
        resumed.run()  # everything cached now
        assert [s.key for s in resumed.steps] == ref_keys
        same = final_checkpoint(tmp_path / "cat", ref_keys) == final_checkpoint(tmp_path / "ref", ref_keys)
        assert same, f"another final checkpoint; the first step to differ: {_first_difference(tmp_path, ref_keys)}"


def _first_difference(tmp_path: Path, keys: list[str]) -> str:
    """The first of `keys` whose stored files (but its metrics, which hold timings) differ
    between the catalogs ``tmp_path/ref`` and ``tmp_path/cat``, and which files."""
    import json

    for key in keys:
        files = [
            json.loads((tmp_path / c / "results" / key / "manifest.json").read_text())["files"] for c in ("ref", "cat")
        ]
        differ = sorted(
            name
            for name in set(files[0]) | set(files[1])
            if name != "metrics.parquet"
            and files[0].get(name, {}).get("sha256") != files[1].get(name, {}).get("sha256")
        )
        if differ:
            return f"{key}: {differ}"
    return "none"


#: the small default with bounded staleness, steps at once, and engine actors: the next
#: rollout reads the policy two back, so it runs beside this iteration's update
CONCURRENT = [
    *[o for o in SMALL if not o.startswith(("rollout.actors", "eval.actors"))],
    "rollout.actors=1",
    "eval.actors=1",
    "pipeline.rollout.inputs={policy: policy@prev:2}",
    "pipeline.mutual_info.inputs={policy: policy@prev:2}",
    "update.correction=decoupled",
]


class TestConcurrentSteps:
    """A class of its own: a unit `pytest --dist loadscope` can hand to another worker."""

    @ACROSS_PROCESSES
    def test_sigkill_during_two_concurrent_steps_resumes_to_the_step_by_step_result(self, tmp_path):
        reference = Runner(load_spec("starpo.yaml", CONCURRENT), Catalog(str(tmp_path / "ref")), Quiet())
        reference.run()
        ref_keys = [s.key for s in reference.steps]
        env = {**os.environ, "PIPELINE_CATALOG": str(tmp_path / "cat")}
        args = [*CONCURRENT, "run.concurrency=2"]
        command = [str(Path(sys.executable).parent / "pipeline"), "run", "starpo.yaml"]
        command += [a for o in args for a in ("-o", o)]
        # a new process, not a `Command`: Ray does not start in a process forked from a fork server that
        # imported it (its GCS client refuses the token of the cluster it starts)
        err = tmp_path / "killed.err"
        with open(err, "wb") as stderr:
            proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        staging = tmp_path / "cat" / "_staging"
        deadline, both = time.time() + 240, False
        while proc.poll() is None and time.time() < deadline:
            in_flight = {p.name.split("-")[0] for p in staging.glob("*-*.*")} if staging.is_dir() else set()
            if {"rollout", "update"} <= in_flight:  # iteration 1's rollout beside iteration 0's update
                both = True
                break
            time.sleep(0.02)
        proc.kill()
        proc.wait(30)
        assert both, f"the two steps never ran at once:\n{err.read_text(errors='replace')[-3000:]}"
        # resumed here (a new process would only add its imports: the CLI's resume is test_cli's)
        resumed = Runner(load_spec("starpo.yaml", args), Catalog(str(tmp_path / "cat")), Quiet())
        summary = resumed.run()
        assert summary.cached > 0 and summary.ran > 0, summary
        assert [s.key for s in resumed.steps] == ref_keys
        same = final_checkpoint(tmp_path / "cat", ref_keys) == final_checkpoint(tmp_path / "ref", ref_keys)
        assert same, f"another final checkpoint; the first step to differ: {_first_difference(tmp_path, ref_keys)}"
