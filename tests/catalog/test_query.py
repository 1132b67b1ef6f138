"""catalog/query.py: stopping a query that DuckDB does not let go of."""

from __future__ import annotations

import threading
import time

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
