"""catalog/query.py: stopping a query that DuckDB does not let go of."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from catalog.query import _wait


class _Deaf:
    """A connection whose query never stops: it counts the interrupts it is sent."""

    def __init__(self) -> None:
        self.interrupts = 0

    def interrupt(self) -> None:
        self.interrupts += 1


def test_an_interrupted_query_that_never_stops_is_given_up_after_the_grace():
    con, done = _Deaf(), threading.Event()
    t0 = time.monotonic()
    assert _wait(done, con, grace=0.5) is False  # type: ignore[arg-type]
    assert 0.5 <= time.monotonic() - t0 < 2.0
    assert con.interrupts >= 2  # interrupted again while it waited


def test_a_query_that_stops_is_waited_for():
    con, done = _Deaf(), threading.Event()
    threading.Timer(0.3, done.set).start()
    assert _wait(done, con, grace=5.0) is True  # type: ignore[arg-type]


def test_a_flipped_byte_in_a_table_gives_the_right_answer_or_an_error_naming_its_file(spec_file, catalog):
    """Whatever byte of a table's data is damaged, a query either answers as before
    (a byte the query does not read) or fails naming the result and file: never another
    answer without a word, never a reader's words alone ("Out of buffer")."""
    import pyarrow.parquet as pq
    import pytest

    from catalog.query import query
    from common.errors import UserError
    from tests.conftest import TEST_PIPELINE, run_spec

    text = TEST_PIPELINE.replace("iterations: 3", "iterations: 1").replace("source: {n: 4}", "source: {n: 20000}")
    run_spec(spec_file(text), catalog)
    key = next(k for k in catalog.result_keys() if k.startswith("t_source"))
    part = next(Path(catalog.root.path("results", key, "numbers")).glob("*.parquet"))
    sql = "select count(*) n, sum(value) s, count(distinct node) d, max(iteration) i from t_numbers"
    want = query(catalog, sql).to_pylist()
    clean = part.read_bytes()
    data_end = len(clean) - 8 - pq.ParquetFile(part).metadata.serialized_size  # the pages, not the footer
    named = 0
    for offset in range(4, data_end, max(1, data_end // 23)):
        damaged = bytearray(clean)
        damaged[offset] ^= 0x10
        part.write_bytes(bytes(damaged))
        try:
            got = query(catalog, sql).to_pylist()
        except UserError as exc:
            assert f"result {key}: numbers/{part.name} differs from what was committed" in str(exc), (offset, exc)
            named += 1
            continue
        assert got == want, offset
    part.write_bytes(clean)
    assert named >= 12, named  # most bytes of a page are read by this query
    damaged = bytearray(clean)
    damaged[-10] ^= 0xFF  # the footer: the view cannot be made, and no read of it answers (a count(*) did: 1)
    part.write_bytes(bytes(damaged))
    for sql in ("select count(*) from t_numbers", "select 1 from t_numbers limit 1"):
        with pytest.raises(UserError, match=rf"view t_numbers is unavailable: .*{part.name} is not a readable"):
            query(catalog, sql)
    part.write_bytes(clean)
