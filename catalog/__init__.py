"""Where data lives: result keys, atomic Parquet/artifact commits, run records and
DuckDB views. Every other room may import it."""

from catalog.datasets import Artifact, ArtifactRef, Table, TableRef
from catalog.errors import CatalogError, PipelineError, SpecError, StageFailed, UserError
from catalog.fs import Root, resolve_root
from catalog.store import Catalog
from catalog.views import connect, query

__all__ = [
    "Artifact", "ArtifactRef", "Catalog", "CatalogError", "PipelineError", "Root", "SpecError",
    "StageFailed", "Table", "TableRef", "UserError", "connect", "query", "resolve_root",
]
