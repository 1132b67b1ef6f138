"""The catalog: immutable stage results under one root, committed atomically.

Layout under the root::

    results/<key>/manifest.json     what made it (stage, version, config, inputs,
                                    seed, iteration), its outputs' files, metrics,
                                    and every file's size and SHA-256 (`check`)
    results/<key>/metrics.parquet   (key, name, value) rows for the `metrics` view
    results/<key>/<output>/...      a table's Parquet files, or an artifact's folder
    runs/<run>/run.parquet          one row describing the run (see catalog.runs)
    runs/<run>/steps.parquet        one row per stage of each iteration: key, ran/cached
    _staging/<key>.<nonce>/         results being written; never read, safe to delete
    _pruned/<key>.json              files of a committed result that `pipeline gc --optimizer-states`
                                    removed (an optimizer state a later update has continued); the
                                    manifest still names them, `check` and `verify` expect them gone
    views.sql                       CREATE VIEW statements for the plain duckdb client

A result is committed when ``results/<key>/manifest.json`` exists. On a local root
the whole result folder is built under ``_staging`` and renamed into place in one
step, so a reader never sees a partial result. On an object store the files are
uploaded first and the manifest is written last. Either way a crash leaves nothing
that a reader or a re-run trusts: a re-run simply writes the result again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from catalog.datasets import (
    SELECTION_COLUMN,
    Artifact,
    ArtifactRef,
    OutputDecl,
    Selection,
    Table,
    TableRef,
    cache_folder,
)
from catalog.fs import Root, resolve_root, shared
from catalog.keys import parse_address
from catalog.manifests import DIGEST, ManifestError, digest, file_sha256, is_name, parse
from common.errors import CatalogError, UserError

MANIFEST = "manifest.json"
METRICS_FILE = "metrics.parquet"
#: ``_damaged/<key>.txt``: what `pipeline verify` found wrong with a result
DAMAGED = "_damaged"
#: ``_pruned/<key>.json``: the files of a result that were removed on purpose (`Catalog.prune`)
PRUNED = "_pruned"
METRICS_SCHEMA = pa.schema([("key", pa.string()), ("name", pa.string()), ("value", pa.float64())])


class Catalog:
    """Reads and writes stage results under one root (see the module docstring)."""

    def __init__(self, root: Root | str | None = None) -> None:
        self.root = root if isinstance(root, Root) else resolve_root(root)

    def check_writable(self) -> None:
        """`UserError` unless a run can write here: a local root must be a folder (or
        not exist yet) that this process can write."""
        root = self.root
        if not root.is_local:
            return
        base = Path(root.base)
        if base.exists() and not base.is_dir():
            raise UserError(f"catalog {root.uri}: is a file, not a folder; check --catalog or PIPELINE_CATALOG")
        try:
            staging = base / "_staging"
            staging.mkdir(parents=True, exist_ok=True)
            probe = staging / f".probe-{uuid.uuid4().hex[:8]}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UserError(
                f"catalog {root.uri}: cannot write there ({exc.strerror or exc}); check --catalog or its permissions"
            ) from None

    def has(self, key: str) -> bool:
        """Whether a committed result exists for `key`."""
        return self.root.exists("results", key, MANIFEST)

    def manifest(self, key: str) -> dict[str, Any]:
        """The manifest of a committed result, checked (`catalog.manifests`):
        `ManifestError` when it is unreadable or tampered with."""
        if not is_name(key):
            raise CatalogError(f"catalog {self.root.uri}: '{key}' is not a result key")
        try:
            data = self.root.read_bytes("results", key, MANIFEST)
        except FileNotFoundError:
            raise CatalogError(f"catalog {self.root.uri}: no committed result '{key}'") from None
        return parse(data, key)

    def manifests(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The manifests of every committed result that is sound, and one line for
        each that is not (an unreadable manifest, or a result `verify` marked damaged)."""
        good, bad = [], []
        marks = set(self.root.list_files(DAMAGED))  # one listing, not a read per result
        for key in self.root.list_dirs("results"):
            if not self.has(key):
                bad.append(f"result {key}: has no manifest (never committed; a run or pipeline gc replaces it)")
                continue
            marked = self.damage_mark(key) if f"{key}.txt" in marks else None
            if marked is not None:
                bad.append(f"result {key}: {marked} (found by pipeline verify; a run computes it again)")
                continue
            try:
                good.append(self.manifest(key))
            except ManifestError as exc:
                bad.append(str(exc))
        return good, bad

    def damage_mark(self, key: str) -> str | None:
        """What `pipeline verify` found wrong with result `key`, or None if it found nothing."""
        try:
            return self.root.read_bytes(DAMAGED, f"{key}.txt").decode("utf-8", "replace").strip() or "damaged"
        except (FileNotFoundError, IsADirectoryError):
            return None

    def mark_damaged(self, key: str, problems: list[str]) -> None:
        """Record that result `key`'s files differ from its manifest (`verify` does):
        readers skip it and the next run that needs it computes it again."""
        self.root.put_atomic("; ".join(problems).encode(), DAMAGED, f"{key}.txt")

    def pruned(self, key: str) -> set[str]:
        """The files (paths relative to the result) removed from result `key` by `prune`;
        none when the mark is missing or not a list of names (then a missing file is
        reported, and the result computed again, as without a mark)."""
        try:
            marked = json.loads(self.root.read_bytes(PRUNED, f"{key}.json"))
        except (FileNotFoundError, IsADirectoryError, ValueError):
            return set()
        return {rel for rel in marked if isinstance(rel, str)} if isinstance(marked, list) else set()

    def prune(self, key: str, rel: str) -> None:
        """Remove the file `rel` of the committed result `key` on purpose (the result
        stays; its manifest, whose digest the runs recorded, is not rewritten): the
        mark is written first, so a crash between the two leaves a file that `check`
        no longer requires, never a missing file that it does."""
        if rel not in self.manifest(key).get("files", {}):
            raise CatalogError(f"catalog {self.root.uri}: result '{key}' has no file '{rel}'")
        self.root.put_atomic(json.dumps(sorted(self.pruned(key) | {rel})).encode(), PRUNED, f"{key}.json")
        with contextlib.suppress(FileNotFoundError):
            self.root.fs.delete_file(self.root.path("results", key, *rel.split("/")))

    def _forget_marks(self, key: str) -> None:
        """Forget what was known of result `key`: its marks, and this machine's downloads of it."""
        for mark in ((DAMAGED, f"{key}.txt"), (PRUNED, f"{key}.json")):
            with contextlib.suppress(FileNotFoundError, OSError):
                self.root.fs.delete_file(self.root.path(*mark))
        if not self.root.is_local:
            shutil.rmtree(cache_folder(self.root.uri, key), ignore_errors=True)

    def quarantine(self, key: str) -> None:
        """Take result `key` out of the catalog whatever state it is in (no manifest,
        an unreadable one, damaged files): on a local root its folder is moved into
        ``_staging`` (a leftover `pipeline gc` removes), elsewhere it is deleted."""
        root = self.root
        if root.is_local:
            src = Path(root.path("results", key))
            aside = Path(root.path("_staging", f"{key}.damaged-{uuid.uuid4().hex[:8]}"))
            aside.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.rename(src, aside)
        else:
            with contextlib.suppress(FileNotFoundError, OSError):
                root.fs.delete_file(root.path("results", key, MANIFEST))
            root.fs.delete_dir_contents(root.path("results", key), missing_dir_ok=True)
        self._forget_marks(key)

    def result_keys(self) -> list[str]:
        """Keys of every committed result."""
        return [k for k in self.root.list_dirs("results") if self.has(k)]

    def ref(self, key: str, output: str, part: tuple[int, int] | None = None) -> TableRef | ArtifactRef:
        """An input handle for one output of a committed result (`part`: a slice of
        a table's rows, see `TableRef`)."""
        out = self.manifest(key)["outputs"].get(output)
        if out is None:
            raise CatalogError(f"catalog {self.root.uri}: result '{key}' has no output '{output}'")
        if out["kind"] == "table":
            source = self.ref(*parse_address(out["selects"])) if out.get("selects") else None
            return TableRef(self.root, key, output, tuple(out["files"]), part, source)  # type: ignore[arg-type]
        return ArtifactRef(self.root, key, output)

    def at(self, address: str) -> TableRef | ArtifactRef:
        """`ref` by dataset address (``<key>/<output>[j/k]``)."""
        return self.ref(*parse_address(address))

    def table(self, address: str) -> TableRef:
        """The table at `address`; CatalogError if that output is an artifact."""
        ref = self.at(address)
        if not isinstance(ref, TableRef):
            raise CatalogError(f"catalog {self.root.uri}: '{address}' is an artifact, not a table")
        return ref

    def check(self, key: str, full: bool = False, manifest: dict[str, Any] | None = None) -> list[str]:
        """What is wrong with the committed result `key`'s files against its manifest
        (`manifest` when the caller has read it already): a file missing or of another
        size; with `full`, also another SHA-256 (reads every byte). [] when all is
        well, or when the manifest records no files (a result committed before they
        were recorded). A file removed by `prune` is not checked (its mark is read only
        when a file is found wrong: a sound result costs no extra read)."""
        problems: list[tuple[str, str]] = []
        for rel, want in (manifest or self.manifest(key)).get("files", {}).items():
            path = self.root.path("results", key, *rel.split("/"))
            info = self.root.fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                problems.append((rel, f"{rel} is missing"))
            elif info.size != want["bytes"]:
                problems.append((rel, f"{rel} has {info.size} bytes, {want['bytes']} were committed"))
            elif full:
                with self.root.fs.open_input_stream(path) as f:
                    digest = hashlib.sha256()
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                if digest.hexdigest() != want["sha256"]:
                    problems.append((rel, f"{rel} differs from what was committed (SHA-256)"))
        gone = self.pruned(key) if problems else set()
        return [problem for rel, problem in problems if rel not in gone]

    def discard(self, key: str) -> None:
        """Take the committed result `key` out of the catalog (its manifest first, so
        nothing trusts it while the rest goes)."""
        self.root.fs.delete_file(self.root.path("results", key, MANIFEST))
        self.root.fs.delete_dir(self.root.path("results", key))
        self._forget_marks(key)

    def writer(self, key: str, outputs: Mapping[str, OutputDecl]) -> ResultWriter:
        """Start writing the result `key`; see `ResultWriter`."""
        return ResultWriter(self, key, outputs)


def existing_catalog(root: str | None) -> Catalog:
    """The catalog at `root` (as `Catalog`), which must already exist: commands that
    only read (query, runs, report) never create one, and a mistyped root is an error."""
    catalog = Catalog(root)
    r = catalog.root
    if r.is_local and Path(r.base).exists() and not Path(r.base).is_dir():
        raise UserError(f"catalog {r.uri}: is a file, not a folder; check --catalog or PIPELINE_CATALOG")
    if not (r.exists("results") or r.exists("runs")):
        raise UserError(
            f"catalog {r.uri}: no catalog there (expected the folder a `pipeline run` writes); check "
            "--catalog or PIPELINE_CATALOG"
        )
    return catalog


class ResultWriter:
    """Stages one result in a private folder and commits it in one step.

    Use `output_dir(name)` to write an artifact (or Parquet files for a table),
    then `commit(...)`; `abort()` (or an exception before commit) leaves nothing
    behind that anyone trusts.
    """

    def __init__(self, catalog: Catalog, key: str, outputs: Mapping[str, OutputDecl]) -> None:
        self.catalog, self.key, self.outputs = catalog, key, dict(outputs)
        root = catalog.root
        nonce = uuid.uuid4().hex[:8]
        if root.is_local:
            self.staging = Path(root.path("_staging", f"{key}.{nonce}"))
            self.staging.mkdir(parents=True)
        else:
            self.staging = Path(tempfile.mkdtemp(prefix=f"{key}.{nonce}."))
        try:
            for name in self.outputs:
                (self.staging / name).mkdir()
        except BaseException:  # an interrupt or a full disk here: nobody holds the writer to abort it
            self.abort()
            raise

    def output_dir(self, name: str) -> Path:
        """The local folder where the stage writes output `name`."""
        if name not in self.outputs:
            raise KeyError(f"'{name}' is not a declared output ({', '.join(self.outputs)})")
        return self.staging / name

    def commit(
        self,
        tables: Mapping[str, pa.Table | Selection],
        metrics: Mapping[str, float],
        info: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Write the returned tables and metrics, check every output is present,
        and publish the result. Returns its manifest."""
        described = {name: self._finish_output(name, decl, tables.get(name)) for name, decl in self.outputs.items()}
        rows = {"key": [self.key] * len(metrics), "name": list(metrics), "value": [float(v) for v in metrics.values()]}
        pq.write_table(pa.table(rows, schema=METRICS_SCHEMA), self.staging / METRICS_FILE, write_page_checksum=True)
        files = {
            p.relative_to(self.staging).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(self.staging.rglob("*"))
            if p.is_file() and p.name != MANIFEST
        }
        manifest = {
            **info,
            "key": self.key,
            "outputs": described,
            "metrics": dict(metrics),
            "files": files,
            "committed_at": time.time(),
        }
        manifest[DIGEST] = digest(manifest)  # checked on every read (`catalog.manifests`)
        (self.staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        self._publish()
        return manifest

    def abort(self) -> None:
        """Drop everything staged."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def _finish_output(self, name: str, decl: OutputDecl, table: pa.Table | Selection | None) -> dict[str, Any]:
        folder = self.staging / name
        selects = None
        if isinstance(table, Selection):
            if not isinstance(decl, Table) or decl.view is not None:
                raise CatalogError(f"output '{name}' is not a table without a view; a selection cannot be stored there")
            selects, own = table.source.address, table.columns
            stored = pa.table({SELECTION_COLUMN: pa.array(table.rows, pa.int64())})
            for field, column in zip(own.schema, own.columns) if own is not None else ():
                stored = stored.append_column(field, column)
            table = stored
        if table is not None:
            if not isinstance(decl, Table):
                raise CatalogError(f"output '{name}' is an artifact; the stage returned a table for it")
            pq.write_table(table, folder / "part-00000.parquet", write_page_checksum=True)  # read checks them
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        if not files:
            raise CatalogError(f"stage produced nothing for its declared output '{name}'")
        if isinstance(decl, Artifact):
            return {"kind": "artifact", "files": files}
        parquet = [f for f in files if f.endswith(".parquet")]
        if len(parquet) != len(files):
            raise CatalogError(f"table output '{name}' holds files that are not Parquet: {files}")
        nrows = sum(pq.ParquetFile(folder / f).metadata.num_rows for f in parquet)
        return {
            "kind": "table",
            "files": parquet,
            "rows": nrows,
            "view": decl.view,
            **({"selects": selects} if selects else {}),
        }

    def _publish(self) -> None:
        root = self.catalog.root
        shared(self.staging)  # readable by whoever reads the catalog, as the umask allows
        for path in self.staging.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        if root.is_local:
            local = Path(root.path("results", self.key))
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(self.staging, local)
            except OSError:
                if self.catalog.has(self.key):
                    self.abort()  # the same result was committed meanwhile; keep that one
                    return
                if not local.exists():
                    raise
                self.catalog.quarantine(self.key)  # a folder left without a manifest: never committed
                os.rename(self.staging, local)
            return
        target = root.path("results", self.key)
        root.fs.delete_dir_contents(target, missing_dir_ok=True)
        for path in sorted(self.staging.rglob("*")):
            if path.is_file() and path.name != MANIFEST:
                rel = path.relative_to(self.staging).as_posix()
                root.fs.create_dir(f"{target}/{rel}".rsplit("/", 1)[0], recursive=True)
                pafs.copy_files(
                    str(path),
                    f"{target}/{rel}",
                    source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=root.fs,
                )
        root.put_atomic((self.staging / MANIFEST).read_bytes(), "results", self.key, MANIFEST)
        self.abort()
