"""The error types: what crosses a process boundary intact."""

from __future__ import annotations

import pickle

from common.errors import StageFailed


def test_a_stage_failure_keeps_its_traceback_through_pickling():
    """Sweep trials run as Ray actors: their failures come back pickled."""
    error = StageFailed("update", 3, ValueError("bad batch"), details="Traceback ...\nValueError: bad batch\n")
    back = pickle.loads(pickle.dumps(error))
    assert (str(back), back.node, back.iteration, back.details) == (
        "stage 'update' (iteration 3) failed: ValueError: bad batch",
        "update",
        3,
        "Traceback ...\nValueError: bad batch\n",
    )
