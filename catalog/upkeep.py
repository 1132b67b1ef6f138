"""Keeping a catalog sound: `verify` (every committed file against its manifest)
and `garbage` / `remove` (what no run needs: staging leftovers, unreferenced results).

A result is referenced when a run's steps name it, or when a referenced result
reads it (its `inputs`, or the table a `Selection` of it reads); everything else
under ``results/`` is garbage. A ``_staging`` entry is a leftover when it is older
than `older_than` seconds: a run writing one right now keeps it fresh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from catalog.keys import parse_address
from catalog.runs import read_steps
from catalog.store import Catalog


def verify(catalog: Catalog) -> list[tuple[str, str]]:
    """(key, problem) for every committed file that is missing or differs from what
    its manifest records (size and SHA-256)."""
    return [(key, problem) for key in catalog.result_keys() for problem in catalog.check(key, full=True)]


@dataclass(frozen=True)
class Garbage:
    """What `garbage` found: staging entries and result keys, with their sizes."""

    staging: list[tuple[str, int]]
    results: list[tuple[str, int]]

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.staging) + sum(n for _, n in self.results)


def referenced(catalog: Catalog) -> set[str]:
    """The keys the catalog's runs need (module docstring)."""
    root = catalog.root
    todo: list[str] = []
    for run in root.list_dirs("runs"):
        steps = read_steps(root, run)
        if steps is not None:
            todo += steps["key"].to_pylist()
    seen: set[str] = set()
    while todo:
        key = todo.pop()
        if key in seen or not catalog.has(key):
            continue
        seen.add(key)
        manifest = catalog.manifest(key)
        todo += [parse_address(a)[0] for a in manifest.get("inputs", {}).values()]
        todo += [parse_address(o["selects"])[0] for o in manifest["outputs"].values() if o.get("selects")]
    return seen


def _size(catalog: Catalog, *parts: str) -> int:
    selector = pafs.FileSelector(catalog.root.path(*parts), recursive=True, allow_not_found=True)
    return sum(i.size or 0 for i in catalog.root.fs.get_file_info(selector) if i.type == pafs.FileType.File)


def garbage(catalog: Catalog, older_than: float = 3600.0) -> Garbage:
    """Staging leftovers and unreferenced results (module docstring)."""
    root, now = catalog.root, time.time()
    staging = []
    selector = pafs.FileSelector(root.path("_staging"), allow_not_found=True)
    for info in root.fs.get_file_info(selector):
        if info.base_name == "shared":
            continue
        if info.mtime is None or now - info.mtime.timestamp() > older_than:
            staging.append((info.base_name, _size(catalog, "_staging", info.base_name)))
    keep = referenced(catalog)
    results = [(k, _size(catalog, "results", k)) for k in root.list_dirs("results") if k not in keep]
    return Garbage(sorted(staging), sorted(results))


def remove(catalog: Catalog, found: Garbage) -> None:
    """Delete what `garbage` found (results: their manifest first)."""
    for name, _ in found.staging:
        catalog.root.fs.delete_dir(catalog.root.path("_staging", name))
    for key, _ in found.results:
        if catalog.has(key):
            catalog.discard(key)
        else:  # a folder without a manifest: never committed
            catalog.root.fs.delete_dir(catalog.root.path("results", key))
