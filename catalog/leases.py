"""Leases: one process computes a result key at a time.

Before a run computes a key it takes the key's lease, ``_leases/<key>.json``,
created atomically (``O_CREAT | O_EXCL`` on a local root) with its owner's host,
pid and start time. A second process that needs the same key finds the lease
taken and waits: when the result is committed it uses it as cached; when the
lease goes away without a result (the owner failed) it takes the lease and
computes the key itself. A lease whose owner is gone (the same host, and no
process with that pid) is taken over. The lease is given back when the step
ends, committed or not. While it is held, a thread touches it every `HEARTBEAT`
seconds, so a reader on another machine (`pipeline gc`) can tell a live lease from
an abandoned one by its age (`live`). A lease file that stays empty or unreadable
for `GRACE` seconds (its owner died between creating and writing it, or the disk
was full) is abandoned: it is taken over, and the waiting run says so.

Object stores have no atomic create-if-absent in pyarrow's filesystems, so on a
remote root `acquire` always succeeds: two runs may compute the same key, and the
catalog stays consistent (the same key is the same content; the last manifest
wins). Stores with conditional writes (S3 ``If-None-Match: *``, GCS
``ifGenerationMatch=0``) could hold the lease there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from catalog.fs import Root

LEASES = "_leases"
#: seconds between two touches of a held lease
HEARTBEAT = 30.0
#: seconds after which an empty or unreadable lease file counts as abandoned
GRACE = 10.0


class Lease:
    """A held lease; `release` gives it back (idempotent). `keep_fresh` starts the
    heartbeat (module docstring), which `release` stops."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def keep_fresh(self, every: float = HEARTBEAT) -> None:
        if self.path is None or self._beat is not None:
            return
        path = self.path

        def beat() -> None:
            while not self._stop.wait(every):
                with contextlib.suppress(OSError):
                    os.utime(path)

        self._beat = threading.Thread(target=beat, name=f"lease-{path.stem}", daemon=True)
        self._beat.start()

    def release(self) -> None:
        self._stop.set()
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None


def _read_owner(path: Path) -> tuple[dict | None, float | None]:
    """(owner, age in seconds) of a lease file; owner None when it is empty or not
    readable JSON; (None, None) when there is no such file."""
    try:
        age = time.time() - path.stat().st_mtime
        owner = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError):
        return None, age
    return (owner if isinstance(owner, dict) and owner else None), age


def live(root: Root, key: str, fresh: float) -> bool:
    """Whether a process may be computing `key` right now: its lease is held by a
    running process of this host, or by another host's process and touched within
    `fresh` seconds, or is being written (empty, younger than `GRACE`)."""
    if not root.is_local:
        return False
    owner, age = _read_owner(Path(root.path(LEASES, f"{key}.json")))
    if age is None:
        return False
    if owner is None:
        return age < GRACE
    if owner.get("host") == socket.gethostname():
        return not owner_gone(owner)
    return age < max(fresh, 2 * HEARTBEAT)


def owner_gone(owner: dict) -> bool:
    if owner.get("host") != socket.gethostname():
        return False  # another machine's process: it cannot be checked from here
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, KeyError):
        return False
    return False


def acquire(
    root: Root,
    key: str,
    done: Callable[[], bool],
    poll: float = 0.5,
    on_wait: Callable[[dict], None] = lambda owner: None,
    on_abandoned: Callable[[Path], None] = lambda path: None,
) -> Lease | None:
    """The lease of `key`, waiting while another live process holds it; None when
    `done()` (the result is committed) became true while waiting. `on_abandoned` is
    told of an empty or unreadable lease file before it is taken over."""
    if not root.is_local:
        return Lease(None)
    path = Path(root.path(LEASES, f"{key}.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner, age = _read_owner(path)
            if age is None:
                continue  # gone meanwhile: try again
            abandoned = owner is None and age >= GRACE
            if abandoned:
                on_abandoned(path)
            if abandoned or (owner is not None and owner_gone(owner)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # taken over: the owner died without giving it back
                continue
            owner = owner or {}
            if done():
                return None
            if owner and not told:
                on_wait(owner)
                told = True
            time.sleep(poll)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}, f)
        if done():  # committed by the previous owner just before it let go
            Lease(path).release()
            return None
        return Lease(path)
