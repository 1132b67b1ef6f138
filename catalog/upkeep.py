"""Keeping a catalog sound: `verify` (every committed file and manifest) and
`garbage` / `remove` (what no run needs: staging leftovers, unreferenced results),
and `superseded_states` / `prune_states` (optimizer states a later update has continued).

A result is referenced when any invocation of a run recorded it in its steps
(`catalog.runs.every_step_key`), or when a referenced result reads it (its
`inputs`, or the table a `Selection` of it reads); everything else under
``results/`` is garbage. A ``_staging`` entry is a leftover when it is older than
`older_than` seconds and no live process holds the lease of its key: a running
stage holds its key's lease and refreshes it and its staging folder
(`catalog.leases`), so `gc` never removes what a run is writing. Nor what a run is
using before its record names it: `remove` keeps every key a live process holds
(`catalog.holds`), deciding and deleting under the collection lock; on an object
store, where there is none, it keeps instead every result committed within
`older_than` seconds.

`verify` checks, for every result: that its manifest is readable and of the form
the catalog writes (`catalog.manifests`); that it is the manifest the runs that used
it recorded (the SHA-256 in their step rows); and every file's size and SHA-256.
A result it finds damaged is marked (``_damaged/<key>.txt``): queries skip it, and
the next run that needs it computes it again. The record digests are a check
against accidents and against editing a manifest alone; someone who can rewrite
both the manifests and the run records can make them agree (a signature would need
a secret the catalog does not have). Either way a manifest's text never runs as
SQL (`catalog.views`).

A full fine-tune keeps the optimizer's state beside each policy version so that the
next update continues it (Adam's moments: twice the weights, 1.07 of every 1.6 GB a
SmolLM2-135M version takes). Once a later committed update has read a version, that
state is needed only to compute that update again. `superseded_states` lists such
states and `prune_states` removes them (`Catalog.prune`: the result and its weights
stay, and stay usable by every eval, rollout and query); the last state of each run
is kept, so a run goes on from where it stopped. An update that would continue a
removed state stops with one line instead of starting the optimizer afresh
(`stages.update`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from catalog.holds import collecting, held, remove_leftovers
from catalog.keys import parse_address
from catalog.leases import live
from catalog.manifests import ManifestError
from catalog.runs import every_step_key, read_record, run_names, step_files
from catalog.store import MANIFEST, Catalog

#: the name of an optimizer state file in a result (the update and critic stages write it)
OPTIMIZER_STATE = "optimizer.pt"


def _recorded_digests(catalog: Catalog) -> dict[str, set[str]]:
    """key -> the manifest SHA-256s that run records name for it."""
    root = catalog.root
    found: dict[str, set[str]] = {}
    for run in run_names(root):
        for f in step_files(root, run):
            try:
                table = read_record(root, f)
            except (FileNotFoundError, OSError, ValueError):
                continue
            if "manifest_sha256" not in table.column_names:
                continue  # recorded before digests were
            for key, digest in zip(table["key"].to_pylist(), table["manifest_sha256"].to_pylist()):
                if digest:
                    found.setdefault(key, set()).add(digest)
    return found


def verify(catalog: Catalog, mark: bool = True) -> list[tuple[str, str]]:
    """(key, problem) for every result folder whose manifest is missing, unreadable or
    not the one its runs recorded, or one of whose files is missing or differs from
    what the manifest records (size and SHA-256). With `mark`, each damaged result is
    marked so the next run computes it again (module docstring)."""
    root = catalog.root
    recorded = _recorded_digests(catalog)
    problems: list[tuple[str, str]] = []
    for key in root.list_dirs("results"):
        if not catalog.has(key):
            problems.append((key, "has no manifest (never committed; a run or pipeline gc replaces it)"))
            continue
        try:
            manifest = catalog.manifest(key)
        except ManifestError as exc:
            problems.append((key, str(exc).split(": ", 1)[-1]))
            continue
        found = catalog.check(key, full=True, manifest=manifest)
        digest = hashlib.sha256(root.read_bytes("results", key, MANIFEST)).hexdigest()
        if key in recorded and digest not in recorded[key]:
            found.insert(0, "manifest.json differs from the one the runs that used it recorded (edited?)")
        problems += [(key, p) for p in found]
        if found and mark:
            catalog.mark_damaged(key, found)
    return problems


@dataclass(frozen=True)
class Garbage:
    """What `garbage` found: staging entries and result keys, with their sizes."""

    staging: list[tuple[str, int]]
    results: list[tuple[str, int]]

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.staging) + sum(n for _, n in self.results)


def referenced(catalog: Catalog, also: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """The keys the catalog's runs need (module docstring), and those that the
    results `also` names need. A result whose manifest is unreadable counts as
    referenced when a run names it (it is repaired by the next run, not deleted),
    but its inputs cannot be followed."""
    root = catalog.root
    todo: list[str] = sorted(also)
    for run in run_names(root):
        todo += sorted(every_step_key(root, run))
    seen: set[str] = set()
    while todo:
        key = todo.pop()
        if key in seen or not catalog.has(key):
            continue
        seen.add(key)
        try:
            manifest = catalog.manifest(key)
        except ManifestError:
            continue
        todo += [parse_address(a)[0] for a in manifest.get("inputs", {}).values()]
        todo += [parse_address(o["selects"])[0] for o in manifest["outputs"].values() if o.get("selects")]
    return seen


def _size(catalog: Catalog, *parts: str) -> int:
    selector = pafs.FileSelector(catalog.root.path(*parts), recursive=True, allow_not_found=True)
    return sum(i.size or 0 for i in catalog.root.fs.get_file_info(selector) if i.type == pafs.FileType.File)


def _staging_key(name: str) -> str:
    """The result key a staging entry is for (``<key>.<nonce>``, ``<key>.damaged-<nonce>``)."""
    return name.split(".", 1)[0]


def _stale_staging(catalog: Catalog, older_than: float) -> list[tuple[str, int]]:
    root, now = catalog.root, time.time()
    staging = []
    for info in root.fs.get_file_info(pafs.FileSelector(root.path("_staging"), allow_not_found=True)):
        if info.base_name == "shared":
            continue
        if info.mtime is not None and now - info.mtime.timestamp() <= older_than:
            continue
        if live(root, _staging_key(info.base_name), older_than):
            continue  # a running stage's: its lease is held and fresh
        staging.append((info.base_name, _size(catalog, "_staging", info.base_name)))
    return staging


def _kept(catalog: Catalog, older_than: float) -> set[str]:
    """The keys `gc` keeps: referenced, held by a live process, or (on an object
    store, which has no holds) committed within `older_than` seconds."""
    root = catalog.root
    keep = referenced(catalog, held(root, older_than))
    if not root.is_local:
        now = time.time()
        for key in root.list_dirs("results"):
            info = root.fs.get_file_info(root.path("results", key, MANIFEST))
            if info.mtime is not None and now - info.mtime.timestamp() <= older_than:
                keep.add(key)
    return keep


def garbage(catalog: Catalog, older_than: float = 3600.0) -> Garbage:
    """Staging leftovers and unreferenced results (module docstring)."""
    keep = _kept(catalog, older_than)
    root = catalog.root
    results = [
        (k, _size(catalog, "results", k))
        for k in root.list_dirs("results")
        if k not in keep and not live(root, k, older_than)
    ]
    return Garbage(sorted(_stale_staging(catalog, older_than)), sorted(results))


def remove(catalog: Catalog, found: Garbage, older_than: float = 3600.0) -> Garbage:
    """Delete what `garbage` found that is still garbage, deciding again under the
    collection lock (a run may have started since; `catalog.holds`); results go
    manifest first. Also removes the hold files of processes that are gone. Returns
    what was removed."""
    with collecting(catalog.root):
        remove_leftovers(catalog.root, older_than)
        return _remove(catalog, found, older_than)


def _remove(catalog: Catalog, found: Garbage, older_than: float) -> Garbage:
    root = catalog.root
    still = {name for name, _ in _stale_staging(catalog, older_than)}
    gone_staging = []
    for name, size in found.staging:
        if name in still:
            root.fs.delete_dir(root.path("_staging", name))
            gone_staging.append((name, size))
    keep = _kept(catalog, older_than)
    gone_results = []
    for key, size in found.results:
        if key in keep or live(root, key, older_than):
            continue
        if catalog.has(key):
            try:
                catalog.discard(key)
            except FileNotFoundError:
                continue
        else:  # a folder without a manifest: never committed
            root.fs.delete_dir(root.path("results", key))
        gone_results.append((key, size))
    return Garbage(gone_staging, gone_results)


def _states(manifest: dict[str, Any]) -> list[str]:
    return [rel for rel in manifest.get("files", {}) if rel.rsplit("/", 1)[-1] == OPTIMIZER_STATE]


def superseded_states(catalog: Catalog, older_than: float = 3600.0) -> list[tuple[str, str, int]]:
    """(key, file, bytes) of each optimizer state that a committed result which keeps
    one of its own has read as an input: its update has been continued (module
    docstring). States already pruned, and results a running stage holds, are left."""
    manifests = {m["key"]: m for m in catalog.manifests()[0] if "key" in m}
    found: list[tuple[str, str, int]] = []
    continued: set[str] = set()
    for m in manifests.values():
        if _states(m):
            continued |= {parse_address(a)[0] for a in m.get("inputs", {}).values()}
    for key in sorted(continued):
        read = manifests.get(key)
        if read is None or live(catalog.root, key, older_than):
            continue
        gone = catalog.pruned(key)
        found += [(key, rel, int(read["files"][rel]["bytes"])) for rel in _states(read) if rel not in gone]
    return found


def prune_states(
    catalog: Catalog, found: list[tuple[str, str, int]], older_than: float = 3600.0
) -> list[tuple[str, str, int]]:
    """Remove what `superseded_states` found (looking again first: a run may have
    started since). Returns what was removed."""
    still = {(k, rel) for k, rel, _ in superseded_states(catalog, older_than)}
    gone = []
    for key, rel, size in found:
        if (key, rel) in still:
            catalog.prune(key, rel)
            gone.append((key, rel, size))
    return gone
