"""Filesystem plumbing: one catalog root on any pyarrow filesystem.

A root is a local path (the default) or a URI that `pyarrow.fs.FileSystem.from_uri`
understands (``file://``, ``s3://``, ``gs://``, ``hdfs://``). Everything else in the
catalog goes through the `Root` object, so no other code cares which it is.
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from common.errors import UserError

DEFAULT_ROOT = "pipeline-data"
ROOT_ENV = "PIPELINE_CATALOG"


@dataclass(frozen=True)
class Root:
    """A resolved catalog root.

    Attributes:
        uri: what the user gave, made absolute for local paths (for display).
        fs: the pyarrow filesystem.
        base: the root's path inside `fs` (no trailing slash).
    """

    uri: str
    fs: pafs.FileSystem
    base: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        """A path inside the root (for `fs` calls)."""
        return "/".join([self.base, *parts])

    def uri_of(self, *parts: str) -> str:
        """A URI (or local absolute path) for readers outside pyarrow, e.g. DuckDB."""
        if self.is_local:
            return self.path(*parts)
        scheme = self.uri.split("://", 1)[0]
        return f"{scheme}://{self.path(*parts)}"

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def read_bytes(self, *parts: str) -> bytes:
        with self.fs.open_input_stream(self.path(*parts)) as f:
            return f.read()

    def put_atomic(self, data: bytes, *parts: str) -> None:
        """Write a small file so that readers see the old content or the new, never
        a part: a temporary name and a rename locally; object stores publish an
        object only when its upload completes."""
        target = self.path(*parts)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        if not self.is_local:
            with self.fs.open_output_stream(target) as f:
                f.write(data)
            return
        tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        shared(Path(tmp))
        os.replace(tmp, target)

    def list_dirs(self, *parts: str) -> list[str]:
        """Names of the sub-folders of a folder in the root (empty if it is absent)."""
        selector = pafs.FileSelector(self.path(*parts), allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def list_files(self, *parts: str) -> list[str]:
        """Names of the files of a folder in the root (empty if it is absent)."""
        selector = pafs.FileSelector(self.path(*parts), allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)


def resolve_root(root: str | None) -> Root:
    """Resolve a root given on the command line or in a spec; `None` means the
    ``PIPELINE_CATALOG`` environment variable, else ``./pipeline-data``."""
    raw = root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT
    if "://" not in raw:
        local = str(Path(raw).expanduser().resolve())
        return Root(uri=local, fs=pafs.LocalFileSystem(), base=local)
    try:
        fs, base = pafs.FileSystem.from_uri(raw)
    except Exception as exc:  # pyarrow raises several types for bad URIs
        raise UserError(f"catalog root '{raw}': not a usable filesystem URI ({exc})") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return Root(uri=base, fs=fs, base=base.rstrip("/"))
    return Root(uri=raw, fs=fs, base=base.rstrip("/"))


_UMASK_LOCK = threading.Lock()


@functools.cache
def _umask() -> int:
    """The process's umask, read once. Linux says it in /proc/self/status; elsewhere it
    is read by setting it and setting it back, under a lock (two threads doing that at
    once would each read the other's temporary value)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def shared(path: Path) -> None:
    """Give `path` (a file, or a folder and everything under it) the mode a plain
    ``open`` or ``mkdir`` would have given it under the umask: libraries that write
    through private temporary files (0600) or folders (0700) would otherwise leave
    results that the catalog's other readers (a group, a shared volume) cannot read."""
    folders = 0o777 & ~_umask()
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in items:
        if item.is_symlink():
            continue
        mode = item.stat().st_mode
        wanted = folders if item.is_dir() else (0o777 if mode & 0o100 else 0o666) & ~_umask()
        if mode & 0o777 != wanted:
            item.chmod(wanted)
