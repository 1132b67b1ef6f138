"""Where data lives: result keys, atomic Parquet/artifact commits, run records and
DuckDB views. `stages` and `pipelines` import it; it imports only `common`.

Names are loaded on first use, so importing `catalog` does not pay for DuckDB and
pyarrow."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Artifact": "catalog.datasets",
    "ArtifactRef": "catalog.datasets",
    "Table": "catalog.datasets",
    "TableRef": "catalog.datasets",
    "CatalogError": "common.errors",
    "PipelineError": "common.errors",
    "SpecError": "common.errors",
    "StageFailed": "common.errors",
    "UserError": "common.errors",
    "Root": "catalog.fs",
    "resolve_root": "catalog.fs",
    "Catalog": "catalog.store",
    "connect": "catalog.views",
    "query": "catalog.query",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'catalog' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
