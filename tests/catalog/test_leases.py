"""Leases: two processes that need the same result key compute it once."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from dataclasses import dataclass

import pyarrow as pa

from catalog.datasets import Table
from catalog.leases import LEASES
from catalog.store import Catalog
from common.config import param
from pipelines.graph.load import load_spec
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from stages.registry import STAGES, StageContext, StageResult, stage


@dataclass(frozen=True)
class SlowConfig:
    log: str = param("", "file that gets a line per execution")
    seconds: float = param(3.0, "how long the stage takes", ge=0)


if "t.slow" not in STAGES:

    @stage("t.slow", config=SlowConfig, outputs={"out": Table()}, metrics={"rollout/rows": "rows"})
    def slow(ctx: StageContext, cfg: SlowConfig) -> StageResult:
        with open(cfg.log, "a") as f:
            f.write(f"{ctx.key}\n")
        time.sleep(cfg.seconds)
        return StageResult(tables={"out": pa.table({"a": [1]})}, metrics={"rollout/rows": 1})


SPEC = "run: {{iterations: 1, seed: 1}}\npipeline:\n  slow: {{stage: t.slow}}\nslow: {{log: '{log}'}}\n"


def _run(path: str, root: str, out: multiprocessing.Queue) -> None:
    display = Quiet()
    Runner(load_spec(path), Catalog(root), display).run()
    out.put([e.status for e in display.events])


def test_two_processes_needing_one_key_compute_it_once(spec_file, tmp_path):
    log = tmp_path / "calls.txt"
    path, root = spec_file(SPEC.format(log=log)), str(tmp_path / "cat")
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this one (Ray threads) is copied
    out = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(path, root, out)) for _ in range(2)]
    for p in procs:
        p.start()
        time.sleep(0.3)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    statuses = sorted(out.get(timeout=5)[0] for _ in procs)
    assert statuses == ["cached", "ran"] and len(log.read_text().splitlines()) == 1
    assert not list((tmp_path / "cat" / LEASES).iterdir())  # given back


def test_a_lease_whose_owner_is_gone_is_taken_over(spec_file, tmp_path):
    import socket

    log = tmp_path / "calls.txt"
    path, root = spec_file(SPEC.format(log=log)), str(tmp_path / "cat")
    spec = load_spec(path)
    runner = Runner(spec, Catalog(root), Quiet())
    key = runner.steps[0].key
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease = tmp_path / "cat" / LEASES / f"{key}.json"
    lease.parent.mkdir(parents=True)
    lease.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "since": 0}))
    t0 = time.time()
    summary = runner.run()
    assert summary.ran == 1 and time.time() - t0 < 10 and not lease.exists()


def test_an_empty_lease_is_taken_over_after_the_grace_period_and_named(spec_file, tmp_path, monkeypatch):
    import catalog.leases

    monkeypatch.setattr(catalog.leases, "GRACE", 0.5)
    log = tmp_path / "calls.txt"
    path, root = spec_file(SPEC.format(log=log)), str(tmp_path / "cat")
    display = Quiet()
    runner = Runner(load_spec(path, ["slow.seconds=0"]), Catalog(root), display)
    lease = tmp_path / "cat" / LEASES / f"{runner.steps[0].key}.json"
    lease.parent.mkdir(parents=True)
    lease.write_bytes(b"")  # the owner died between creating and writing it
    t0 = time.time()
    summary = runner.run()
    assert summary.ran == 1 and time.time() - t0 < 10 and not lease.exists()
    assert any(str(lease) in w and "empty or unreadable" in w for w in display.warnings)


def test_a_held_lease_is_live_and_kept_fresh(tmp_path):
    import os
    import socket

    from catalog.fs import resolve_root
    from catalog.leases import acquire, live

    root = resolve_root(str(tmp_path / "cat"))
    lease = acquire(root, "k-1", lambda: False)
    assert lease is not None and lease.path is not None and live(root, "k-1", fresh=60)
    os.utime(lease.path, (time.time() - 500, time.time() - 500))
    lease.keep_fresh(every=0.05)
    time.sleep(0.3)
    assert time.time() - lease.path.stat().st_mtime < 5  # the heartbeat touched it
    other = tmp_path / "cat" / LEASES / "k-2.json"
    other.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    os.utime(other, (time.time() - 500, time.time() - 500))
    assert not live(root, "k-2", fresh=60)  # another host's lease not touched for 500 s: abandoned
    other.write_text(json.dumps({"host": socket.gethostname() + "-not", "pid": 1}))
    assert live(root, "k-2", fresh=60)
    lease.release()
    assert not live(root, "k-1", fresh=60)


def test_gc_apply_during_a_running_stage_leaves_the_run_to_finish(spec_file, tmp_path):
    from typer.testing import CliRunner

    from pipelines.cli.main import app

    log = tmp_path / "calls.txt"
    path, root = spec_file(SPEC.format(log=log)), str(tmp_path / "cat")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_run, args=(path, root, out))
    proc.start()
    staging = tmp_path / "cat" / "_staging"
    deadline = time.time() + 60
    while not (staging.exists() and any(staging.iterdir())) and time.time() < deadline:
        time.sleep(0.1)
    assert any(staging.iterdir()), "the stage never started"
    result = CliRunner().invoke(app, ["gc", "--apply", "--older-than", "0", "--catalog", root])  # every folder is "old"
    assert result.exit_code == 0 and "nothing to remove" in result.stdout, result.output
    proc.join(60)
    assert proc.exitcode == 0 and out.get(timeout=5) == ["ran"]
    assert len(list((tmp_path / "cat" / "results").iterdir())) == 1
