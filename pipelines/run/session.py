"""The Ray session of a run and its signals: SIGINT/SIGTERM as `Interrupted` in the
main thread, and a local Ray started on first use (`pipelines.run.runner`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.errors import Interrupted


class Signals:
    """While a run lasts, SIGINT and SIGTERM raise `Interrupted` in the main thread
    (Ray installs its own SIGTERM handler, which dumps native stacks and aborts: it
    is replaced again after Ray starts). Off the main thread (a sweep trial) the
    process's handlers are left alone."""

    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}
        self.received: int | None = None  # the last signal (Ray Tune re-raises a plain KeyboardInterrupt)
        self.hook: Callable[[Any], Any] | None = None  # sys.unraisablehook before `install`

    def __getstate__(self) -> dict[str, Any]:
        """A copy holds the signal received and no handlers: Ray Tune pickles its callbacks
        (the sweep's checks `check`) into its experiment state, and a handler or hook
        replaced since it was saved does not pickle."""
        return {"saved": {}, "received": self.received, "hook": None}

    def _raise(self, signum: int, frame: Any) -> None:
        self.received = signum
        raise Interrupted(signum)

    def check(self) -> None:
        """Raise the interrupt of a signal received whose `Interrupted` was lost: raised
        inside code that drops every exception (a weakref callback or a `__del__` the
        collector runs, where Python prints "Exception ignored in" and goes on), the
        run would otherwise finish as if no signal had come. The runner checks between
        steps; a raised interrupt that did arrive has ended the run before then."""
        if self.received is not None:
            raise Interrupted(self.received)

    def _unraisable(self, info: Any) -> None:
        """An interrupt dropped where it was raised is not printed (`check` raises it
        again); anything else goes to the hook that was there before."""
        if not isinstance(info.exc_value, Interrupted):
            (self.hook or sys.__unraisablehook__)(info)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._raise)
            self.saved.setdefault(signum, previous)
        if self.hook is None:
            self.hook, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        self.saved.clear()
        if self.hook is not None:
            sys.unraisablehook, self.hook = self.hook, None


#: the environment variable of Ray's worker niceness (Ray's default: 15)
WORKER_NICENESS = "RAY_worker_niceness"
#: the environment variable that keeps a local Ray session a run (or sweep) of this
#: process started up after it ends, for the next one in the process (`keep_ray`)
KEEP_RAY = "PIPELINE_KEEP_RAY"


def keep_ray() -> bool:
    """Whether a local Ray session that a run started in this process stays up after
    the run (``PIPELINE_KEEP_RAY=1``): the runs of a notebook, a script or a test suite
    then start Ray once (about 3 CPU-seconds and seven helper processes each time
    otherwise). What a run put in it (engine actors, the trainer's worker group) still
    ends with the run (`common.live`). The command line never keeps it: the process ends."""
    return os.environ.get(KEEP_RAY, "").strip().lower() not in ("", "0", "false", "no")


def package_root() -> str:
    """The folder that holds this project's packages (`envs`, `stages`, `pipelines`, ...)."""
    return str(Path(__file__).resolve().parents[2])


def worker_runtime_env(runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """`runtime_env` with the package root first on the workers' ``PYTHONPATH``. Ray
    puts the driver's working directory first on every worker's import path; from a
    folder holding a directory named like one of the packages (`configs/` has
    `envs/`, the env YAML files) the worker imported that directory as an empty
    namespace package and failed (`module 'envs' has no attribute 'make'`). A regular
    package anywhere on the path wins over a namespace one, and an editable install's
    import hook comes after both, so the root goes on the path itself."""
    env = dict(runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    existing = env_vars.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    env_vars["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), existing) if p)
    env["env_vars"] = env_vars
    return env


def start_ray(address: str | None, **kwargs: Any) -> None:
    """`ray.init` as the runner and sweeps call it: connect to `address`, or start a
    local cluster of its own (never one started with `ray start` on this machine, which
    Ray would otherwise join) whose workers run at the driver's priority (nice 0 unless
    ``RAY_worker_niceness`` says otherwise: at Ray's default of 15 the engine actor
    gave its CPU to the driver's and Ray's own threads, bench/rollout.py), and import
    this project's packages whatever the working directory (`worker_runtime_env`).
    Ray's default of token authentication is kept; only its notice that it is on (a
    warning line in the middle of the run's display) is silenced."""
    import logging

    import ray

    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    kwargs["runtime_env"] = worker_runtime_env(kwargs.get("runtime_env"))
    if address:
        kwargs["address"] = address
    else:
        # a Ray of its own: without an address, Ray itself would join any cluster started with
        # `ray start` on this machine (it looks for one), not start the local one asked for
        kwargs["address"] = "local"
        os.environ.setdefault(WORKER_NICENESS, "0")  # Ray's 15: an engine actor yields the CPU to every process
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **kwargs)


class _Ray:
    """Starts Ray on first use and shuts it down after the run if it started it (unless
    `keep`: `keep_ray`)."""

    def __init__(
        self,
        address: str | None,
        num_cpus: int | None,
        on_start: Callable[[], None] = lambda: None,
        keep: bool = False,
    ) -> None:
        self.address, self.num_cpus, self.started, self.on_start = address, num_cpus, False, on_start
        self.keep, self.noted = keep, False

    def __call__(self) -> None:
        import ray

        if ray.is_initialized():
            self._note()
            return
        address = self.address or os.environ.get("RAY_ADDRESS")
        try:
            start_ray(address, **({} if address else {"num_cpus": self.num_cpus}))
        except SystemExit as exc:  # Ray's own SIGTERM handler, installed while it starts, exits
            if exc.code in (signal.SIGTERM, int(signal.SIGTERM)):
                self.started = True  # what it had started is shut down with the run
                raise Interrupted(signal.SIGTERM) from None
            raise
        self.started = True
        self._note()
        self.on_start()

    def _note(self) -> None:
        """Once a run, at its first use of Ray (started by it or kept from before): the
        nodes already dead are not this run's losses (`stages.lost_nodes.note_session`)."""
        if not self.noted:
            from stages.lost_nodes import note_session

            note_session()
            self.noted = True

    def shutdown(self) -> None:
        if self.started and not self.keep:
            import ray

            ray.shutdown()
