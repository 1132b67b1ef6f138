"""Integrity: every committed file is recorded with its size and SHA-256; a damaged
cached result is reported and computed again; `verify` and `gc`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from catalog.datasets import Table
from catalog.store import Catalog
from catalog.upkeep import garbage, referenced, remove, superseded_states, verify
from common.errors import CatalogError, UserError
from pipelines.cli.main import app
from pipelines.graph.load import load_spec
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from tests.conftest import SMALL_DEFAULT, TEST_PIPELINE, run_spec


def parquet_files(catalog, prefix):
    key = next(k for k in catalog.result_keys() if k.startswith(prefix))
    return key, sorted(Path(catalog.root.base).glob(f"results/{key}/*/*.parquet"))


def test_a_commit_records_each_file_with_its_size_and_checksum(spec_file, catalog):
    run_spec(spec_file(TEST_PIPELINE), catalog)
    key = catalog.result_keys()[0]
    files = catalog.manifest(key)["files"]
    assert "metrics.parquet" in files and all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in files.values())
    assert catalog.check(key, full=True) == [] and verify(catalog) == []


def test_a_damaged_cached_result_is_reported_and_computed_again(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    key, (part, *_) = parquet_files(catalog, "t_source")
    expected = pq.read_table(part)
    part.write_bytes(part.read_bytes()[:-20])  # truncated
    again, display = run_spec(path, catalog)
    assert any(key in w and "computing it again" in w for w in display.warnings)
    assert again.ran >= 1 and pq.read_table(part).equals(expected) and catalog.check(key, full=True) == []
    os.remove(part)  # missing
    again, display = run_spec(path, catalog)
    assert any(f"result {key}:" in w and "is missing" in w for w in display.warnings) and part.exists()


def test_verify_finds_a_flipped_byte_that_keeps_the_size(spec_file, catalog):
    run_spec(spec_file(TEST_PIPELINE), catalog)
    key, (part, *_) = parquet_files(catalog, "t_source")
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    assert catalog.check(key) == []  # same size: only the full check sees it
    assert verify(catalog) == [(key, f"{part.parent.name}/{part.name} differs from what was committed (SHA-256)")]
    result = CliRunner().invoke(app, ["verify", "--catalog", catalog.root.uri])
    assert result.exit_code == 1 and f"result {key}:" in result.stderr


def test_gc_lists_then_removes_only_what_no_run_needs(spec_file, catalog):
    run_spec(spec_file(TEST_PIPELINE), catalog)
    needed = set(catalog.result_keys())
    assert referenced(catalog) == needed
    catalog.writer("orphan-1", {"t": Table()}).commit({"t": pa.table({"a": [1]})}, {}, {})
    old = catalog.root.path("_staging", "dead.abc")
    os.makedirs(old)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    os.makedirs(catalog.root.path("_staging", "fresh.abc"))
    dry = CliRunner().invoke(app, ["gc", "--catalog", catalog.root.uri])
    assert dry.exit_code == 0 and "results/orphan-1" in dry.stdout and "_staging/dead.abc" in dry.stdout
    assert "fresh.abc" not in dry.stdout and catalog.has("orphan-1")  # a dry run removes nothing
    found = garbage(catalog)
    assert [k for k, _ in found.results] == ["orphan-1"] and [n for n, _ in found.staging] == ["dead.abc"]
    remove(catalog, found)
    assert set(catalog.result_keys()) == needed and not os.path.exists(old)
    again, _ = run_spec(spec_file(TEST_PIPELINE), catalog)
    assert again.ran == 0


def test_gc_never_removes_a_running_stages_staging(spec_file, catalog, tmp_path):
    """A stage running longer than --older-than: its staging is old, but its lease is held."""
    from catalog.leases import acquire

    key = "update-0123456789abcdef"
    staging = Path(catalog.root.path("_staging", f"{key}.abcd1234"))
    staging.mkdir(parents=True)
    (staging / "weights.bin").write_bytes(b"x" * 100)
    os.utime(staging, (time.time() - 7200, time.time() - 7200))
    Path(catalog.root.path("results")).mkdir(parents=True, exist_ok=True)
    lease = acquire(catalog.root, key, lambda: False)
    assert lease is not None
    try:
        result = CliRunner().invoke(app, ["gc", "--apply", "--older-than", "1", "--catalog", catalog.root.uri])
        assert result.exit_code == 0 and staging.exists() and key not in result.stdout
    finally:
        lease.release()
    result = CliRunner().invoke(app, ["gc", "--apply", "--older-than", "1", "--catalog", catalog.root.uri])
    assert f"removed _staging/{key}.abcd1234" in result.stdout and not staging.exists()


def test_a_shorter_rerun_never_shrinks_what_gc_keeps(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    needed = set(catalog.result_keys())
    run_spec(path, catalog, ["run.iterations=1"])  # the same name, a shorter record
    assert referenced(catalog) == needed
    assert garbage(catalog).results == []


def test_two_invocations_of_one_name_keep_both_records(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    run_spec(path, catalog, ["source.n=2"])
    invocations = Path(catalog.root.path("runs", "spec", "invocations"))
    records = sorted(invocations.iterdir())
    assert len(records) == 2 and all((r / "steps.parquet").exists() and (r / "run.parquet").exists() for r in records)
    sources = {pq.read_table(r / "steps.parquet").to_pylist()[1]["key"] for r in records}
    assert len(sources) == 2  # the first source step of each: different keys


def test_every_path_a_run_writes_stays_under_the_root(spec_file, tmp_path):
    from catalog.store import Catalog

    root = tmp_path / "deep" / "cat"
    path = spec_file(TEST_PIPELINE)
    before = {p for p in tmp_path.rglob("*")}
    run_spec(path, Catalog(str(root)))
    written = {p for p in tmp_path.rglob("*")} - before
    assert written and all(p.resolve().is_relative_to(root.resolve()) or p == root.parent for p in written)


#: the small default (an embedded model, full fine-tuning), three updates in this process, each
#: on a batch (zero-std groups kept)
SMALL_RL = ["run.iterations=3", *SMALL_DEFAULT, "rollout.actors=0", "eval.actors=0", "filter.drop_zero_std=false"]
#: the same, every policy version stored (by default only the last of these three is: the others are
#: kept in the trainer's memory and hold no optimizer state to remove)
STORED = [*SMALL_RL, "update.checkpoint_every=1"]


def test_gc_removes_only_the_optimizer_states_a_later_update_continued(tmp_path):
    """Each run keeps its last state (it can go on), every weight file stays, the run is
    still all cached, and an update that would continue a removed state stops with one
    line instead of starting AdamW afresh."""
    catalog = Catalog(str(tmp_path / "catalog"))
    runner = Runner(load_spec("starpo.yaml", STORED), catalog, Quiet())
    runner.run()
    updates = [s.key for s in runner.steps if s.key.startswith("update-")]
    assert len(updates) == 3
    states = superseded_states(catalog)
    assert [(k, rel) for k, rel, _ in states] == sorted((k, "policy/optimizer.pt") for k in updates[:2])
    dry = CliRunner().invoke(app, ["gc", "--optimizer-states", "--catalog", catalog.root.uri])
    assert dry.exit_code == 0 and "2 continued optimizer states" in dry.stdout
    assert all(Path(catalog.root.path("results", k, "policy", "optimizer.pt")).exists() for k in updates)
    plain = CliRunner().invoke(app, ["gc", "--catalog", catalog.root.uri])
    assert "nothing to remove" in plain.stdout  # without the flag, states are not garbage

    done = CliRunner().invoke(app, ["gc", "--optimizer-states", "--apply", "--catalog", catalog.root.uri])
    assert done.exit_code == 0 and f"removed results/{updates[0]}/policy/optimizer.pt" in done.stdout
    for key in updates:
        policy = Path(catalog.root.path("results", key, "policy"))
        assert (policy / "model.safetensors").exists()
        assert (policy / "optimizer.pt").exists() == (key == updates[-1])
    assert verify(catalog) == [] and superseded_states(catalog) == []
    again, display = run_spec("starpo.yaml", catalog, tuple(STORED))
    assert again.ran == 0 and not display.warnings  # a pruned result is still sound

    longer, _ = run_spec("starpo.yaml", catalog, (*STORED, "run.iterations=4"))
    assert longer.ran >= 1  # the run goes on from its last, kept state

    catalog.discard(updates[-1])  # computing v3 again would continue v2's removed state
    with pytest.raises(UserError, match=f"result {updates[1]}: its optimizer state.*keep_optimizer=false"):
        run_spec("starpo.yaml", catalog, tuple(SMALL_RL))


def test_a_prune_mark_without_its_deletion_leaves_a_sound_result(spec_file, catalog):
    """A crash between the mark and the deletion: the file is there, nothing requires it."""
    run_spec(spec_file(TEST_PIPELINE), catalog)
    key, (part, *_) = parquet_files(catalog, "t_source")
    rel = f"{part.parent.name}/{part.name}"
    size = part.stat().st_size
    catalog.root.put_atomic(f'["{rel}"]'.encode(), "_pruned", f"{key}.json")
    part.write_bytes(b"short")  # what is not required is not checked
    assert catalog.check(key, full=True) == [] and catalog.pruned(key) == {rel}
    with pytest.raises(CatalogError, match="has no file"):
        catalog.prune(key, "no/such.file")
    for garbled in (b"{not json", b'{"a": 1}', b"[1, 2]"):  # a damaged mark excuses nothing
        catalog.root.put_atomic(garbled, "_pruned", f"{key}.json")
        assert catalog.pruned(key) == set() and catalog.check(key) == [f"{rel} has 5 bytes, {size} were committed"]
