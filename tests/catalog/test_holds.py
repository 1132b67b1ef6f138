"""Holds: `pipeline gc` keeps what a live run uses before its record names it, and a
run never uses a result that gc removes meanwhile (the order and the lock of
`catalog.holds`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from catalog.datasets import Table
from catalog.holds import Holds, collecting
from catalog.runs import read_steps
from catalog.store import Catalog
from catalog.upkeep import garbage, remove
from tests.conftest import TEST_PIPELINE, run_spec


def _orphan(catalog: Catalog, key: str) -> None:
    catalog.writer(key, {"t": Table()}).commit({"t": pa.table({"a": [1]})}, {}, {})


def _dead_pid() -> int:
    done = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_gc_keeps_what_a_live_process_holds_and_drops_a_dead_ones_holds(catalog):
    _orphan(catalog, "orphan-1")
    _orphan(catalog, "orphan-2")
    holds = Holds(catalog.root)
    holds.hold("orphan-1")
    dead = Path(catalog.root.path("_holds", "dead.txt"))
    dead.write_text(json.dumps({"host": __import__("socket").gethostname(), "pid": _dead_pid()}) + "\norphan-2\n")
    try:
        gone = remove(catalog, garbage(catalog, 0), 0)
        assert [k for k, _ in gone.results] == ["orphan-2"] and catalog.has("orphan-1")
        assert not dead.exists()  # a killed process's hold file is a leftover
    finally:
        holds.release()
    assert not list(Path(catalog.root.path("_holds")).glob("*.txt"))  # the run's file goes with it
    assert [k for k, _ in remove(catalog, garbage(catalog, 0), 0).results] == ["orphan-1"]


def test_a_hold_waits_while_gc_decides_and_deletes(catalog):
    _orphan(catalog, "orphan-1")
    holds, took = Holds(catalog.root), threading.Event()
    try:
        with collecting(catalog.root):
            waiter = threading.Thread(target=lambda: (holds.hold("orphan-1"), took.set()))
            waiter.start()
            assert not took.wait(0.5)  # gc is between reading the holds and its last deletion
        assert took.wait(10)
        waiter.join()
        assert garbage(catalog, 0).results == []
    finally:
        holds.release()


def test_a_run_taking_up_results_while_gc_deletes_them_records_only_what_stays(spec_file, catalog, monkeypatch):
    """The soak's failure, made certain: gc has decided that a killed run's results
    (committed, never recorded) are garbage and is deleting them when a re-run finds
    them committed. The re-run waits for gc, then computes them again; it never
    records (or reads) a result that gc removes."""
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    expected = {r["key"] for r in read_steps(catalog.root, "spec").to_pylist()}
    shutil.rmtree(catalog.root.path("runs"))  # as if killed before recording a step
    found = garbage(catalog, 0)
    assert {k for k, _ in found.results} == expected

    go, deleting = threading.Event(), threading.Event()
    discard = Catalog.discard

    def slow_discard(self: Catalog, key: str) -> None:
        deleting.set()
        assert go.wait(30)
        discard(self, key)

    monkeypatch.setattr(Catalog, "discard", slow_discard)
    gc = threading.Thread(target=remove, args=(catalog, found, 0))
    gc.start()
    assert deleting.wait(30)
    outcome: list[object] = []
    rerun = threading.Thread(target=lambda: outcome.append(run_spec(path, catalog)[0]))
    rerun.start()
    time.sleep(1.0)  # without the lock the re-run has taken every result up, cached, by now
    go.set()
    gc.join(30)
    rerun.join(60)
    assert not gc.is_alive() and not rerun.is_alive() and outcome
    steps = read_steps(catalog.root, "spec").to_pylist()
    assert {r["key"] for r in steps} == expected and all(catalog.has(k) for k in expected)
    assert {r["status"] for r in steps} == {"ran"}  # gc went first: all computed again


def test_gc_on_an_object_store_keeps_what_was_committed_lately(tmp_path):
    pytest.importorskip("moto.server")
    from tests.s3 import loopback_s3

    with loopback_s3("holds-bucket") as endpoint:
        catalog = Catalog(f"s3://holds-bucket/catalog?{endpoint}")
        _orphan(catalog, "orphan-1")
        assert garbage(catalog, 3600).results == []  # as young as a run's own commit before its record
        assert [k for k, _ in remove(catalog, garbage(catalog, 0), 0).results] == ["orphan-1"]
