"""Integrity: every committed file is recorded with its size and SHA-256; a damaged
cached result is reported and computed again; `verify` and `gc`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from catalog.datasets import Table
from catalog.upkeep import garbage, referenced, remove, verify
from pipelines.cli import app
from tests.conftest import TEST_PIPELINE, run_spec


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
