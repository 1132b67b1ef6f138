"""Leases: one process computes a result key at a time.

Before a run computes a key it takes the key's lease, ``_leases/<key>.json``,
created atomically (``O_CREAT | O_EXCL`` on a local root) with its owner's host,
pid and start time. A second process that needs the same key finds the lease
taken and waits: when the result is committed it uses it as cached; when the
lease goes away without a result (the owner failed) it takes the lease and
computes the key itself. A lease whose owner is gone (the same host, and no
process with that pid) is taken over. The lease is given back when the step
ends, committed or not.

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
import time
from collections.abc import Callable
from pathlib import Path

from catalog.fs import Root

LEASES = "_leases"


class Lease:
    """A held lease; `release` gives it back (idempotent)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def release(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.path = None


def _owner_gone(owner: dict) -> bool:
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
) -> Lease | None:
    """The lease of `key`, waiting while another live process holds it; None when
    `done()` (the result is committed) became true while waiting."""
    if not root.is_local:
        return Lease(None)
    path = Path(root.path(LEASES, f"{key}.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                owner = {}  # being written, or gone: look again
            if owner and _owner_gone(owner):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # taken over: the owner died without giving it back
                continue
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
