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

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
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

#: schema metadata of a table whose rows form groups numbered 0..N-1: N, the groups
#: planned (a rollout's, dropped episodes or not); `TableRef` slices it on group edges
GROUPS_KEY = b"groups"

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

    def read(self, columns: list[str] | None = None, lenient: bool = False) -> pa.Table:
        """The whole table in memory (`columns`: only those; `lenient`: those of them it has)."""
        if not self.files:
            return pa.table({})
        wanted = columns
        if columns is not None and self.part is not None and "group" not in columns:
            columns, lenient = [*columns, "group"], True  # a slice on group edges needs it (`_slice`); dropped after
        if self.source is not None:
            own = pa.concat_tables([_read(p, self.root) for p in self.paths()])
            names = [c for c in own.column_names if c != SELECTION_COLUMN]
            picked = self.source.read(None if columns is None else [c for c in columns if c not in names], lenient)
            picked = picked.take(own[SELECTION_COLUMN])
            for c in names:
                if columns is None or c in columns:
                    picked = picked.append_column(own.schema.field(c), own[c])
            table = picked
        else:
            parts = [_read(p, self.root, columns, lenient) for p in self.paths()]
            table = pa.concat_tables(parts, promote_options="default")
        table = self._slice(table)
        return table if wanted is None else table.select(wanted)

    def _slice(self, table: pa.Table) -> pa.Table:
        """Part (j, k) of `table`. A table that records how many groups were planned
        (`GROUPS_KEY`) is sliced on its ``group`` column: part j holds the groups of
        the j-th of k equal ranges of group numbers, whatever rows were dropped before
        it was committed (an episode whose environment failed), so a group is never
        split across iterations. Any other table is sliced by row count."""
        if self.part is None:
            return table
        j, k = self.part
        planned = (table.schema.metadata or {}).get(GROUPS_KEY)
        if planned is not None and "group" in table.column_names:
            import pyarrow.compute as pc

            groups = int(planned)
            lo, hi = groups * j // k, groups * (j + 1) // k
            group = table["group"]
            return table.filter(pc.and_(pc.greater_equal(group, lo), pc.less(group, hi)))
        lo, hi = table.num_rows * j // k, table.num_rows * (j + 1) // k
        return table.slice(lo, hi - lo)


def _read(path: str, root: Root, columns: list[str] | None = None, lenient: bool = False) -> pa.Table:
    """One Parquet file, its pages' CRCs checked where they were written (the catalog
    writes them): a damaged page is an error, never wrong rows. `lenient`: of
    `columns`, those the file has."""
    if columns is not None and lenient:
        names = set(pq.read_schema(path, filesystem=root.fs).names)
        columns = [c for c in columns if c in names]
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

    def checked(self, folder: Path, names: tuple[str, ...]) -> None:
        """Raise `CatalogError` unless each of `names` found in `folder` (this artifact's
        `local_path()`) has the SHA-256 its manifest lists (a name it does not list, in a
        folder rebuilt from a resident recipe, is not checked): for the few files a reader
        takes from an artifact the step's own checks never read, e.g. a replayed
        rollout's tokenizer."""
        from catalog.manifests import file_sha256, parse

        files = parse(self.root.read_bytes("results", self.key, "manifest.json"), self.key).get("files", {})
        for name in names:
            want = files.get(f"{self.output}/{name}")
            if want is not None and (folder / name).is_file() and file_sha256(folder / name) != want["sha256"]:
                from common.errors import CatalogError

                raise CatalogError(
                    f"result {self.key}: {self.output}/{name} differs from what was committed (SHA-256); "
                    "pipeline verify moves it aside and a run computes it again"
                )

    def stored_path(self) -> Path:
        """A local folder holding the artifact as committed: the committed folder
        itself for a local root; for a remote one, a download kept in
        `artifact_cache()`. A download is used only once every file's SHA-256 equals
        its manifest's, and its folder is named after those digests: a result
        quarantined and computed again under the same key is downloaded again, never
        served the old bytes. It is made in a folder of its own and renamed into
        place, so a folder found there is whole (engine actors on one node that fetch
        the same policy at once never read a file another is still writing); a found
        one whose files are not the manifest's sizes is downloaded again."""
        if self.root.is_local:
            return Path(self.root.path("results", self.key, self.output))
        import pyarrow.fs as pafs

        from catalog.manifests import parse

        manifest = parse(self.root.read_bytes("results", self.key, "manifest.json"), self.key)
        prefix = f"{self.output}/"
        files = {rel[len(prefix) :]: want for rel, want in manifest.get("files", {}).items() if rel.startswith(prefix)}
        tag = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
        cache = cache_folder(self.root.uri, self.key) / f"{self.output}-{tag}"
        if cache.is_dir():
            if not files or _as_listed(cache, files, full=False) is None:
                return cache
            aside = cache.with_name(f".{cache.name}.changed-{os.getpid()}-{threading.get_ident()}")
            with contextlib.suppress(OSError):  # changed here: moved aside whole, then removed
                os.rename(cache, aside)
            shutil.rmtree(aside, ignore_errors=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f".{self.output}.", dir=cache.parent))
        try:
            pafs.copy_files(
                self.root.path("results", self.key, self.output),
                str(part),
                source_filesystem=self.root.fs,
                destination_filesystem=pafs.LocalFileSystem(),
            )
            wrong = _as_listed(part, files, full=True) if files else None  # none listed: committed before they were
            if wrong is not None:
                from common.errors import CatalogError

                raise CatalogError(
                    f"result {self.key}/{self.output} on {self.root.uri}: {wrong}; "
                    "pipeline verify names it, and a run computes it again"
                )
            from catalog.fs import shared

            shared(part)
            try:
                os.rename(part, cache)
            except OSError:
                if not cache.is_dir():  # not another process's download, renamed first
                    raise
        finally:
            shutil.rmtree(part, ignore_errors=True)
        return cache


def _as_listed(folder: Path, files: dict[str, Any], full: bool) -> str | None:
    """What differs between `folder` and a manifest's `files` of it (relative path ->
    ``{bytes, sha256}``): a file missing or extra, another size, with `full` another
    SHA-256; None when it is as listed."""
    from catalog.manifests import file_sha256

    found = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    for rel in sorted(set(found) | set(files)):
        if rel not in files:
            return f"{rel} was not committed"
        if rel not in found:
            return f"{rel} is missing"
        if found[rel].stat().st_size != files[rel]["bytes"]:
            return f"{rel} has {found[rel].stat().st_size} bytes, {files[rel]['bytes']} were committed"
        if full and file_sha256(found[rel]) != files[rel]["sha256"]:
            return f"{rel} differs from what was committed (SHA-256)"
    return None


def cache_folder(uri: str, key: str) -> Path:
    """The local folder of result `key`'s downloads from the catalog at `uri`."""
    return artifact_cache() / hashlib.sha256(uri.encode()).hexdigest()[:16] / key


def artifact_cache() -> Path:
    """Where artifacts of a remote catalog are downloaded: ``$STARPO_ARTIFACTS`` or
    ``~/.cache/starpo-pipeline/artifacts`` (one folder per catalog, then per result)."""
    configured = os.environ.get("STARPO_ARTIFACTS")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "starpo-pipeline" / "artifacts"


REF_TYPES: dict[type, type] = {Table: TableRef, Artifact: ArtifactRef}
