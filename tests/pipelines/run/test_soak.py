"""A soak: several runs on one catalog for a while, with `pipeline query` and
`pipeline gc --apply` in a loop beside them and random SIGKILLs of the runs; then every
result verifies, every run record reads, and every run resumes to the result of a run
that was never disturbed.

10 s of faults in the suite (about 6 kills and 4 collections; at least 3 of each and a
finished run, however loaded the machine); longer with
``SOAK_SECONDS=600 pytest tests/pipelines/run/test_soak.py``.
The runs are `tests/fixtures/demo.yaml` (three stages, a second a run, so hundreds of
commits, kills and collections fit in the time) at three seeds, and with
``SOAK_REAL=1`` also the default spec made small (a real LM, Ray, checkpoints)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import SMALL_DEFAULT

ROOT = Path(__file__).resolve().parents[3]
EXE = Path(sys.executable).parent / "pipeline"
DEMO = str(ROOT / "tests" / "fixtures" / "demo.yaml")


def _specs() -> dict[str, list[str]]:
    """Run name -> the `pipeline run` arguments after the catalog."""
    out = {
        f"demo-{seed}": [
            DEMO,
            "-o",
            f"run.name=demo-{seed}",
            "-o",
            f"run.seed={seed}",
            "-o",
            f"run.iterations={10 + 5 * seed}",
        ]
        for seed in range(3)
    }
    if os.environ.get("SOAK_REAL"):
        small = [a for o in ["run.iterations=2", "run.name=lm", *SMALL_DEFAULT] for a in ("-o", o)]
        out["lm"] = ["starpo.yaml", *small]
    return out


def _pipeline(*args: str, catalog: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIPELINE_CATALOG": ""}
    return subprocess.run(
        [str(EXE), *args, "--catalog", str(catalog)], capture_output=True, text=True, env=env, timeout=timeout
    )


def _final(catalog: Path, run: str) -> dict[tuple[str, int | None], tuple[str, str]]:
    """(node, iteration) -> (key, the SHA-256 of every output file of its result) for a
    run's latest invocation (its metrics hold timings, which differ run to run)."""
    done = _pipeline(
        "query",
        f"select node, iteration, key from steps where run = '{run}' and "
        f"invocation = (select invocation from runs where run = '{run}')",
        "--format",
        "json",
        catalog=catalog,
    )
    assert done.returncode == 0, done.stderr
    out = {}
    for row in json.loads(done.stdout):
        manifest = json.loads((catalog / "results" / row["key"] / "manifest.json").read_text())
        files = json.dumps({n: f["sha256"] for n, f in sorted(manifest["files"].items()) if n != "metrics.parquet"})
        out[(row["node"], row["iteration"])] = (row["key"], files)
    return out


def test_runs_queries_collections_and_kills_together_lose_nothing(tmp_path):
    specs = _specs()
    seconds = float(os.environ.get("SOAK_SECONDS", "10"))
    rng = random.Random(int(os.environ.get("SOAK_SEED", "0")))

    # the undisturbed results, one run at a time in a catalog of their own
    reference = tmp_path / "reference"
    for args in specs.values():
        done = _pipeline("run", *args, catalog=reference)
        assert done.returncode == 0, done.stderr
    expected = {name: _final(reference, name) for name in specs}

    catalog = tmp_path / "soak"
    stop = threading.Event()
    troubles: list[str] = []
    counts = {"runs": 0, "kills": 0, "queries": 0, "collections": 0, "finished": 0}

    def upkeep() -> None:
        while not stop.is_set():
            if not (catalog / "views.sql").exists():
                time.sleep(0.2)
                continue
            query = _pipeline(
                "query",
                "select r.run, r.status, count(*) from runs r join steps s using (run) group by all",
                catalog=catalog,
            )
            counts["queries"] += 1
            if query.returncode not in (0,):
                troubles.append(f"query: exit {query.returncode}: {query.stderr.strip()}")
            gc = _pipeline("gc", "--apply", catalog=catalog)
            counts["collections"] += 1
            if gc.returncode != 0:
                troubles.append(f"gc --apply: exit {gc.returncode}: {gc.stderr.strip()}")

    keeper = threading.Thread(target=upkeep)
    keeper.start()
    env = {**os.environ, "PIPELINE_CATALOG": ""}
    running: list[tuple[subprocess.Popen, str, float]] = []
    deadline = time.monotonic() + seconds
    latest = deadline + 6 * seconds  # a loaded machine: go on until the least the soak must have seen

    def enough() -> bool:
        return counts["kills"] >= 3 and counts["collections"] >= 3 and counts["finished"] >= 1

    try:
        while time.monotonic() < deadline or (not enough() and time.monotonic() < latest):
            late = time.monotonic() >= deadline and not counts["finished"]  # let a run finish, killed or not
            while len(running) < 2:
                name = rng.choice(sorted(specs))
                proc = subprocess.Popen(
                    [str(EXE), "run", *specs[name], "--catalog", str(catalog)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
                running.append((proc, name, float("inf") if late else time.monotonic() + rng.uniform(0.3, 4.0)))
                counts["runs"] += 1
            time.sleep(0.05)
            for item in list(running):
                proc, name, kill_at = item
                if proc.poll() is not None:
                    running.remove(item)
                    err = proc.stderr.read() if proc.stderr else ""
                    if proc.returncode == 0:
                        counts["finished"] += 1
                    else:  # a run that was not killed may only fail by waiting on a killed one's lease
                        troubles.append(f"run {name}: exit {proc.returncode}: {err.strip()[-400:]}")
                elif time.monotonic() >= kill_at:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    running.remove(item)
                    counts["kills"] += 1
    finally:
        for proc, _, _ in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stop.set()
        keeper.join()
    print(f"soak of {seconds:g} s: {counts}")
    assert enough(), counts
    assert not troubles, "\n".join(troubles)

    # every run resumes to its undisturbed result, and the catalog is sound
    for name, args in specs.items():
        done = _pipeline("run", *args, catalog=catalog)
        assert done.returncode == 0, done.stderr
        assert _final(catalog, name) == expected[name], name
    verify = _pipeline("verify", catalog=catalog)
    assert verify.returncode == 0, verify.stderr
    runs = _pipeline("query", "select run, status from runs order by run", "--format", "json", catalog=catalog)
    assert runs.returncode == 0, runs.stderr
    assert {r["run"]: r["status"] for r in json.loads(runs.stdout)} == dict.fromkeys(specs, "finished")


def test_the_soak_can_fail(tmp_path):
    """The check the soak ends with sees a damaged result: one flipped byte fails verify."""
    name, args = next(iter(_specs().items()))
    catalog = tmp_path / "c"
    assert _pipeline("run", *args, catalog=catalog).returncode == 0
    key = next(iter(_final(catalog, name).values()))[0]
    manifest = json.loads((catalog / "results" / key / "manifest.json").read_text())
    victim = catalog / "results" / key / sorted(manifest["files"])[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    assert _pipeline("verify", catalog=catalog).returncode == 1
