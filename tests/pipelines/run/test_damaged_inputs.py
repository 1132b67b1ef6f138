"""A committed result whose bytes differ from its manifest is never read as valid by a
run (`pipelines.run.steps`: every byte of a step's inputs is checked before it runs)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.datasets import Table
from catalog.upkeep import verify
from tests.conftest import CALLS, TEST_PIPELINE, run_spec


@pytest.fixture
def filled(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    catalog.spec_path = path
    CALLS.clear()
    return catalog


def _key(catalog, stage: str, iteration: int) -> str:
    return next(
        k for k in catalog.result_keys() if k.startswith(stage) and catalog.manifest(k)["iteration"] == iteration
    )


def _flip_keeping_size_and_time(path: Path, at: int | None = None) -> None:
    """Silent corruption: one byte changed, the size and the modification time kept."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_flipped_byte_in_a_table_a_step_reads_is_found_and_recomputed(filled, concurrency):
    source, scale = _key(filled, "t_source", 1), _key(filled, "t_scale", 1)
    before = filled.ref(scale, "scaled").read()
    part = next(Path(filled.root.path("results", source)).glob("numbers/*.parquet"))
    _flip_keeping_size_and_time(part)
    filled.discard(scale)  # the step that reads the damaged table must run
    _, display = run_spec(filled.spec_path, filled, (f"run.concurrency={concurrency}",))
    warned = [w for w in display.warnings if source in w]
    assert len(warned) == 1 and "SHA-256" in warned[0] and "computing it again" in warned[0], display.warnings
    assert "\n" not in warned[0]
    assert CALLS["source"] == 1 and CALLS["scale"] == 1  # the damaged result and its reader, nothing else
    assert filled.ref(scale, "scaled").read().equals(before)
    assert verify(filled) == []
    moved = list(Path(filled.root.path("_staging")).glob(f"{source}.damaged-*"))
    assert len(moved) == 1  # set aside for a look (pipeline gc removes it), not deleted


def test_a_flipped_byte_in_a_checkpoint_a_step_loads_is_found_and_recomputed(filled):
    first, second = _key(filled, "t_state", 1), _key(filled, "t_state", 2)
    count = Path(filled.root.path("results", first, "state", "count.txt"))
    assert count.read_text() == "2"
    _flip_keeping_size_and_time(count, at=0)  # "2" -> "3": same size, a plausible value
    filled.discard(second)
    _, display = run_spec(filled.spec_path, filled)
    assert any(first in w and "SHA-256" in w for w in display.warnings), display.warnings
    assert CALLS["state"] == 2  # iteration 1 again, then 2 on it
    assert filled.manifest(second)["metrics"]["actor/count"] == 3  # not 4: the damaged "3" was never read
    assert verify(filled) == []


@pytest.fixture
def hashed(filled, monkeypatch):
    """`full` of every `Catalog.check` call: True where every byte was read."""
    calls = []
    real = type(filled).check

    def check(self, key, full=False, manifest=None):
        calls.append(full)
        return real(self, key, full, manifest)

    monkeypatch.setattr(type(filled), "check", check)
    return calls


def test_nothing_is_read_through_when_nothing_runs(filled, hashed):
    """A resumed run whose steps are all cached reads no result's bytes."""
    summary, _ = run_spec(filled.spec_path, filled)
    assert summary.ran == 0 and hashed and not any(hashed)


def test_results_this_run_wrote_are_not_hashed_again(filled, hashed):
    """A run that computes every step takes each result's hashes as it commits it."""
    for key in filled.result_keys():
        filled.discard(key)
    summary, _ = run_spec(filled.spec_path, filled)
    assert summary.ran > 0 and not any(hashed)


def test_a_damaged_parquet_page_is_an_error_not_wrong_rows(tmp_path, catalog):
    """The catalog writes page CRCs and reads them back: the format's own protection,
    for readers that do not go through a manifest."""
    table = pa.table({"v": list(range(1000))})
    writer = catalog.writer("t-crc", {"numbers": Table()})
    writer.commit({"numbers": table}, {}, {"stage": "t", "iteration": None, "inputs": {}, "config": {}})
    ref = catalog.ref("t-crc", "numbers")
    path = Path(ref.paths()[0])
    assert pq.ParquetFile(path).metadata.num_rows == 1000
    _flip_keeping_size_and_time(path, at=100)  # inside the first data page
    with pytest.raises(OSError, match="CRC"):
        ref.read()
