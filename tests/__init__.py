"""The test suite. Its processes, and the ones they start (which inherit it), run one
OpenMP/torch thread unless they set their own (engine actors and trainer workers do):
two pytest-xdist workers on two cores, each with a thread per core, oversubscribed the
cores, and the waiting threads' spinning cost about a fifth of the suite's CPU time
(four stage modules with ``pytest -n 2``: 310 CPU-seconds with the default, 238 with one
thread). Set here, before any test module imports torch."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
