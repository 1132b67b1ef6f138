"""The test suite. Three settings for its processes and the ones they start (which inherit
them), made here before any test module imports torch:

- One OpenMP/torch thread unless a process sets its own (engine actors and trainer
  workers do): two pytest-xdist workers on two cores, each with a thread per core,
  oversubscribed the cores, and the waiting threads' spinning cost about a fifth of the
  suite's CPU time (four stage modules with ``pytest -n 2``: 310 CPU-seconds with the
  default, 238 with one thread).
- Bytecode is written, even where the environment says not to (``PYTHONDONTWRITEBYTECODE``):
  the suite starts hundreds of Python processes (`pipeline` commands, Ray workers and
  actors), and without a cache each compiled this project's modules again on import.
- Ray starts no worker ahead of demand (``RAY_prestart_worker_first_driver=0``): the
  suite starts about forty Ray sessions, and each prestarted idle workers (a second of
  CPU each) that most runs, with one engine actor, never use."""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
