"""Dataset kinds: how a stage declares its outputs and receives its inputs.

Two kinds exist. A *table* is Parquet (trajectories, batches, evaluations): the
stage returns a `pyarrow.Table`, or writes Parquet files itself into its output
folder (e.g. with Ray Data), or returns a `Selection` of an input table's rows
(stored as the row numbers only; reading it reads those rows of the input: a
filter keeps no second copy of what it keeps). An *artifact* is a folder of
files the stage writes (a Hugging Face checkpoint). A stage declares outputs with `Table(...)` /
`Artifact(...)` and annotates inputs with `TableRef` / `ArtifactRef`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from catalog.fs import Root


@dataclass(frozen=True)
class Table:
    """Declares a table output. `view`: the DuckDB view its rows join (all results
    feeding one view are unioned by column name), or None for no view; `schema`: the
    view's columns, so that it exists (empty) on a catalog without its rows
    (`catalog.schemas.TABLE_VIEWS`)."""

    view: str | None = None
    doc: str = ""
    schema: pa.Schema | None = None  # the view's columns: with it the view exists, empty, before any rows


@dataclass(frozen=True)
class Artifact:
    """Declares an artifact output: a folder the stage writes (e.g. a checkpoint).
    `resident`: the stage may commit it as a *resident* result, whose large files stay
    in the memory of the process that made it (`RESIDENT_FILE`, `ArtifactRef.local_path`)."""

    doc: str = ""
    resident: bool = False


#: the file of a resident artifact: the digest of the files it does not store and how
#: to rebuild them (its stage's business); the folder holds only small metadata besides
RESIDENT_FILE = "resident.json"

#: how a resident artifact's full folder is made where the files are read (set by the
#: package that writes resident artifacts, `stages.training.resident`): ``resolve(ref)``
#: returns a local folder holding the whole artifact, checked against its digest
RESOLVERS: dict[str, Callable[[ArtifactRef], Path]] = {}


OutputDecl = Table | Artifact

#: the one column of a selection's files: row numbers into its source table
SELECTION_COLUMN = "row"


@dataclass(frozen=True)
class Selection:
    """What a stage may return for a table output: `rows` (numbers, in the order
    wanted) of its input `source`, with `columns` of its own (one value per
    selected row) added after the source's. Only the numbers and the own columns
    are stored."""

    source: TableRef
    rows: Any  # a sequence or array of int
    columns: pa.Table | None = None


@dataclass(frozen=True)
class TableRef:
    """A committed table dataset, as a stage input. With `part` = (j, k) it is the
    j-th of k equal slices of the rows, in their stored order (Online-k: one
    iteration's share of a rollout that serves k iterations)."""

    root: Root
    key: str
    output: str
    files: tuple[str, ...]
    part: tuple[int, int] | None = None
    source: TableRef | None = None  # a selection's input: its files hold row numbers into it

    @property
    def address(self) -> str:
        from catalog.keys import dataset_address

        return dataset_address(self.key, self.output, self.part)

    def paths(self) -> list[str]:
        """Paths of its Parquet files inside the root's filesystem."""
        return [self.root.path("results", self.key, self.output, f) for f in self.files]

    def read(self, columns: list[str] | None = None) -> pa.Table:
        """The whole table in memory."""
        if not self.files:
            return pa.table({})
        if self.source is not None:
            own = pa.concat_tables([_read(p, self.root) for p in self.paths()])
            names = [c for c in own.column_names if c != SELECTION_COLUMN]
            picked = self.source.read(None if columns is None else [c for c in columns if c not in names])
            picked = picked.take(own[SELECTION_COLUMN])
            for c in names:
                if columns is None or c in columns:
                    picked = picked.append_column(own.schema.field(c), own[c])
            return self._slice(picked if columns is None else picked.select(columns))
        parts = [_read(p, self.root, columns) for p in self.paths()]
        return self._slice(pa.concat_tables(parts, promote_options="default"))

    def _slice(self, table: pa.Table) -> pa.Table:
        if self.part is None:
            return table
        j, k = self.part
        lo, hi = table.num_rows * j // k, table.num_rows * (j + 1) // k
        return table.slice(lo, hi - lo)


def _read(path: str, root: Root, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file, its pages' CRCs checked where they were written (the catalog
    writes them): a damaged page is an error, never wrong rows."""
    return pq.read_table(path, columns=columns, filesystem=root.fs, page_checksum_verification=True)


@dataclass(frozen=True)
class ArtifactRef:
    """A committed artifact folder, as a stage input."""

    root: Root
    key: str
    output: str

    @property
    def address(self) -> str:
        return f"{self.key}/{self.output}"

    def local_path(self) -> Path:
        """A local folder holding the whole artifact. A resident one (`resident`) is
        made by its resolver (`RESOLVERS`); otherwise it is `stored_path()`."""
        info = self.resident()
        if info is None:
            return self.stored_path()
        kind = str(info.get("kind", ""))
        if kind not in RESOLVERS:
            from common.errors import CatalogError

            raise CatalogError(
                f"result {self.key}/{self.output} keeps its files in the memory of the run that made it, and "
                f"nothing here can rebuild a resident '{kind}' artifact"
            )
        return RESOLVERS[kind](self)

    def resident(self) -> dict[str, Any] | None:
        """The resident file of an artifact committed without its large files, or None
        for an artifact stored whole. Reads that one small file, never downloads the
        artifact from a remote root."""
        try:
            data = self.root.read_bytes("results", self.key, self.output, RESIDENT_FILE)
        except (FileNotFoundError, IsADirectoryError):
            return None
        return json.loads(data)

    def stored_path(self) -> Path:
        """A local folder holding the artifact as committed: the committed folder
        itself for a local root; for a remote one, a download kept in
        `artifact_cache()`. The download is made in a folder of its own and renamed
        into place, so a folder found there is whole: engine actors on one node that
        fetch the same policy at once never read a file another is still writing."""
        if self.root.is_local:
            return Path(self.root.path("results", self.key, self.output))
        import pyarrow.fs as pafs

        where = hashlib.sha256(self.root.uri.encode()).hexdigest()[:16]
        cache = artifact_cache() / where / self.key / self.output
        if cache.is_dir():
            return cache
        cache.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f".{self.output}.", dir=cache.parent))
        try:
            pafs.copy_files(
                self.root.path("results", self.key, self.output),
                str(part),
                source_filesystem=self.root.fs,
                destination_filesystem=pafs.LocalFileSystem(),
            )
            try:
                os.rename(part, cache)
            except OSError:
                if not cache.is_dir():  # not another process's download, renamed first
                    raise
        finally:
            shutil.rmtree(part, ignore_errors=True)
        return cache


def artifact_cache() -> Path:
    """Where artifacts of a remote catalog are downloaded: ``$STARPO_ARTIFACTS`` or
    ``~/.cache/starpo-pipeline/artifacts`` (one folder per catalog, then per result)."""
    configured = os.environ.get("STARPO_ARTIFACTS")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "starpo-pipeline" / "artifacts"


REF_TYPES: dict[type, type] = {Table: TableRef, Artifact: ArtifactRef}
