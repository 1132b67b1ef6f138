"""The test suite. Four settings for its processes and the ones they start (which inherit
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
  suite starts many Ray sessions, and each prestarted idle workers (a second of CPU
  each) that most runs, with one engine actor, never use.
- A Ray session that an in-process run starts stays up for the next test in the process
  (``PIPELINE_KEEP_RAY=1``, `pipelines.run.session.keep_ray`): each session costs about
  8 CPU-seconds to start (Ray's processes and Ray Data's two actors). A test of what a
  run starts and leaves asks for ``no_ray`` (tests/conftest.py); `pipeline` commands
  never keep one."""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("PIPELINE_KEEP_RAY", "1")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
