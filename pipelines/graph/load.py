"""Loading a spec: find the file, merge its presets, apply the overrides, build the
typed spec (`pipelines.spec.build`) and check its graph (`pipelines.graph.dag`)."""

from __future__ import annotations

from pathlib import Path

from common.errors import SpecError
from pipelines.graph.dag import build_graph
from pipelines.spec.build import Origins, Spec, apply_override, build_spec
from pipelines.spec.imports import import_modules, load_entry_points
from pipelines.spec.yamlio import find_spec, load_with_extends


def load_spec(name: str, overrides: tuple[str, ...] | list[str] = (), imports: tuple[str, ...] = ()) -> Spec:
    """Find, merge, override and validate a spec, including its wiring (raises
    `SpecError` for any mistake, before anything runs). The user's stage modules are
    imported first (`pipelines.spec.imports`): the entry points, `imports` (``--import``)
    and the spec's own ``imports:``."""
    path = find_spec(name)
    origins = Origins()
    data = load_with_extends(path, origins)
    for text in overrides:
        apply_override(data, origins, text)
    load_entry_points()
    import_modules(imports, [Path.cwd()], "--import")
    listed = data.get("imports") or []
    if not isinstance(listed, list):
        raise SpecError(origins.where("imports"), "imports", f"expected a list of module names, got {listed!r}")
    import_modules(listed, [path.parent, Path.cwd()], f"{origins.where('imports')}: imports")
    spec = build_spec(data, origins, str(path))
    build_graph(spec)
    return spec
