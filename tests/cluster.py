"""A Ray cluster of several nodes on this machine, as `ray start` makes one on many, for
the tests and benches of the cluster path (docs/cluster.md).

The head holds no CPUs, so every task, engine actor and Ray Train worker lands on a
worker node. Each worker node runs from its own working directory with its own
``TMPDIR``: a local path that one node hands another is missing there. Nodes get the
environment a cluster's nodes would have (the object store's credentials), and token
authentication is off (Ray 2.60 turns it on where ``~/.ray/auth_token`` exists, and
nodes started without the token cannot join).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"
READY = "This command will now block forever"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: how soon the head sees a node whose raylet was killed: ~4 s, against Ray's default of ~14 s
#: (a check every 3 s, dead after 5 missed), measured here; a test that kills a node waits that long
HEALTH_CHECK = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": "3",
}


class LocalCluster:
    """A head (no CPUs) and `workers` worker nodes of `cpus` CPUs each, under `root`;
    `env` is added to every node's environment."""

    def __init__(self, root: Path, workers: int = 2, cpus: int = 2, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.cpus = cpus
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", **HEALTH_CHECK, **(env or {})}
        # Ray's sockets live under its temp dir: a short path keeps them under the 107-byte limit
        self.temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self._start(
            "head",
            "--head",
            f"--port={self.port}",
            "--num-cpus=0",
            "--include-dashboard=false",
            f"--temp-dir={self.temp}",
        )
        self._wait(["head"])
        for i in range(1, workers + 1):  # one at a time: nodes started together can pick the same free port
            self.add(f"node{i}")

    def _start(self, name: str, *args: str) -> None:
        cwd = self.root / name
        (cwd / "tmp").mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115  (kept by the process)
        self.nodes[name] = subprocess.Popen(
            [str(RAY), "start", "--block", *args],
            cwd=cwd,
            env={**self.env, "TMPDIR": str(cwd / "tmp")},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def add(self, name: str) -> None:
        """Start (or start again) worker node `name`."""
        self._start(name, f"--address={self.address}", f"--num-cpus={self.cpus}", f'--resources={{"{name}": 1}}')
        self._wait([name])

    def _wait(self, names: list[str], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            log = self.root / f"{name}.log"
            while READY not in log.read_text(errors="replace"):
                if self.nodes[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray node {name} did not start:\n{log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.2)

    def stop(self, name: str, hard: bool = False) -> None:
        """Stop node `name`: SIGKILL its processes (a lost machine) if `hard`, else `ray start`'s
        own shutdown (SIGTERM)."""
        proc = self.nodes.pop(name)
        if hard:
            # the node's session: its raylet, and the workers the raylet started
            subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def pids(self, pattern: str) -> dict[str, list[int]]:
        """The processes of this cluster whose command line matches `pattern` (`pgrep -f`), by
        node: a node's processes are in its `ray start`'s session (its raylet and the workers
        that raylet started), so another test's Ray on this machine is not counted."""
        found: dict[str, list[int]] = {}
        for name, proc in self.nodes.items():
            out = subprocess.run(["pgrep", "-s", str(proc.pid), "-f", pattern], capture_output=True, text=True)
            if pids := [int(p) for p in out.stdout.split()]:
                found[name] = pids
        return found

    def close(self) -> None:
        """Stop every node, and whatever process of this cluster is left."""
        for name in [n for n in self.nodes if n != "head"] + ["head"]:
            if name in self.nodes:
                proc = self.nodes.pop(name)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # the raylets, workers and GCS all name the session folder under this temp dir
        subprocess.run(["pkill", "-KILL", "-f", str(self.temp)], check=False)
