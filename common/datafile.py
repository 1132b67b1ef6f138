"""A data file a config names (task records, transcripts): its content hash and its
parsed content come from one read of its bytes, so the hash a result's key holds and
the content its stage used are the same.

Reads are kept in the run's live state (`common.live`, slot "data files"), by path,
parser, size and modification time: the spec's check, the plan's keys and the stage
read a file once a run, and nothing is kept after it. A stage that must use what its
key says passes the planned hash (`load(..., expect=)`): a file edited since fails
with one line instead of training on other content under the same key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from common import live

T = TypeVar("T")

#: files whose content a run keeps parsed at once (the oldest is dropped first)
KEPT = 16


def digest_of(data: bytes) -> str:
    """The content hash of a data file, as result keys hold it."""
    return hashlib.sha256(data).hexdigest()[:16]


class _Files(dict[tuple[Any, ...], tuple[str, dict[str, Any]]]):
    """The run's slot: (path, size, mtime) -> (content hash, parsed content by parser)."""

    def close(self) -> None:
        self.clear()


def load(path: Path, parse: Callable[[bytes], T], expect: str | None = None, variant: str = "") -> tuple[str, T]:
    """(content hash, ``parse(bytes)``) of `path`, both from one read; ValueError naming
    the file when it is missing, unreadable, or (with `expect`) no longer the content
    whose hash the run planned with. `variant` tells apart the parses of one parser that
    depend on more than the bytes (a records file read for another prompt field)."""
    return _load(path, parse, expect, variant)


def digest(path: Path) -> str:
    """The content hash of `path`."""
    return _load(path, None, None, "")[0]


def _load(path: Path, parse: Callable[[bytes], T] | None, expect: str | None, variant: str) -> tuple[str, Any]:
    try:
        st = os.stat(path)
    except OSError:
        raise ValueError(f"path '{path}': no such file") from None
    key = (str(path), st.st_size, st.st_mtime_ns)
    fn = getattr(parse, "func", parse)  # a functools.partial: its function (`variant` says the rest)
    name = "" if fn is None else f"{fn.__module__}.{fn.__qualname__}/{variant}"
    files = live.slot("data files", _Files)
    entry = files.get(key)
    if entry is None or (parse is not None and name not in entry[1]):
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"path '{path}': cannot be read ({type(exc).__name__})") from None
        hashed = digest_of(data)
        if entry is None or entry[0] != hashed:  # new, or rewritten within one size and time stamp
            entry = (hashed, {})
        if parse is not None:
            entry[1][name] = parse(data)
        files.pop(key, None)
        while len(files) >= KEPT:
            files.pop(next(iter(files)))
        files[key] = entry
    if expect is not None and entry[0] != expect:
        raise ValueError(
            f"path '{path}': changed since the run was planned (content {entry[0]}, planned {expect}); "
            "run the command again to plan with the new content"
        )
    return entry[0], entry[1].get(name)
