"""Holds: the results a running process uses, which `pipeline gc` keeps.

A run uses a result before its record names it (`catalog.runs`): one it found
committed (by an earlier, killed invocation, or by another process) from the moment
it finds it until its step row is written, one it computes from the commit until the
row, and every input it reads. So before a run looks a key up it adds the key to its
hold file, ``_holds/<nonce>.txt`` (its owner's host, pid and start time as a JSON
first line, then one key a line), and `gc` keeps every key a live process holds. A
process of this host is live while its pid runs; another host's while its hold file
was touched within `fresh` seconds (a thread touches it every
`catalog.leases.HEARTBEAT` seconds). The file goes when the run ends; a killed
process's file is a leftover that `gc --apply` removes.

What makes this sound is an order and a lock. A run writes the hold, then looks;
`gc` reads the holds, then deletes. The hold is written under the catalog's
collection lock (``_holds/lock``, `flock`) taken shared, and `gc` takes it
exclusively from before it reads the run records and the holds until its last
deletion (`collecting`). So either the run's hold is there when gc reads, and the
result stays, or gc has finished deleting before the run looks, and the run
computes the result again; a result never goes between a run's look and its use.

Object stores have neither `flock` nor an append: there no hold is kept, and `gc`
keeps instead every result committed within its ``--older-than`` (`catalog.upkeep`),
which covers a run's own commits but not an older result that a re-run takes up
while `gc --apply` runs; run it there between runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from catalog.fs import Root
from catalog.leases import HEARTBEAT, Lease, owner_gone

HOLDS = "_holds"
LOCK = "lock"


@contextlib.contextmanager
def _flock(root: Root, mode: int) -> Iterator[None]:
    if not root.is_local:
        yield
        return
    folder = Path(root.path(HOLDS))
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor lets go of the lock


def collecting(root: Root) -> contextlib.AbstractContextManager[None]:
    """The collection lock, taken exclusively: `gc` decides and deletes inside it
    (module docstring). A no-op on an object store."""
    return _flock(root, fcntl.LOCK_EX)


class Holds:
    """One process's hold file on one catalog (module docstring); `hold` is
    thread-safe and idempotent, `release` ends every hold (idempotent)."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.keys: set[str] = set()
        self._lease: Lease | None = None
        self._lock = threading.Lock()

    def hold(self, key: str) -> None:
        """Hold `key` from now until `release`; call it before looking the key up."""
        if not self.root.is_local:
            return
        with self._lock:
            if key in self.keys:
                return
            with _flock(self.root, fcntl.LOCK_SH):
                if self._lease is None:
                    path = Path(self.root.path(HOLDS, f"{uuid.uuid4().hex}.txt"))
                    owner = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
                    path.write_text(json.dumps(owner) + "\n")
                    self._lease = Lease(path)
                    self._lease.keep_fresh()
                assert self._lease.path is not None
                with open(self._lease.path, "a") as f:
                    f.write(key + "\n")
            self.keys.add(key)

    def release(self) -> None:
        with self._lock:
            if self._lease is not None:
                self._lease.release()
                self._lease = None
            self.keys.clear()


def _read(path: Path) -> tuple[dict | None, float | None, list[str]]:
    """(owner, age in seconds, keys) of a hold file; owner None when its first line is
    not an owner; (None, None, []) when it is gone."""
    try:
        age = time.time() - path.stat().st_mtime
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None, None, []
    except OSError:
        return None, 0.0, []
    try:
        owner = json.loads(lines[0]) if lines else None
    except ValueError:
        owner = None
    return (owner if isinstance(owner, dict) else None), age, [k for k in lines[1:] if k]


def _files(root: Root) -> list[Path]:
    folder = Path(root.path(HOLDS))
    return sorted(p for p in folder.glob("*.txt")) if folder.is_dir() else []


def _is_live(owner: dict | None, age: float, fresh: float) -> bool:
    if owner is None:
        return age < fresh  # being written, or unreadable: kept while it is young
    if owner.get("host") == socket.gethostname():
        return not owner_gone(owner)
    return age < max(fresh, 2 * HEARTBEAT)


def held(root: Root, fresh: float) -> set[str]:
    """Every key a live process holds (module docstring); call it inside `collecting`."""
    out: set[str] = set()
    for path in _files(root):
        owner, age, keys = _read(path)
        if age is not None and _is_live(owner, age, fresh):
            out.update(keys)
    return out


def remove_leftovers(root: Root, fresh: float) -> int:
    """Delete the hold files of processes that are gone; how many. Call it inside
    `collecting`."""
    gone = 0
    for path in _files(root):
        owner, age, _ = _read(path)
        if age is not None and not _is_live(owner, age, fresh):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                gone += 1
    return gone
