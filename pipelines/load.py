"""Loading a spec: find the file, merge its presets, apply the overrides, build the
typed spec (`pipelines.spec`) and check its graph (`pipelines.dag`)."""

from __future__ import annotations

from pipelines.dag import build_graph
from pipelines.spec import Origins, Spec, apply_override, build_spec
from pipelines.yamlio import find_spec, load_with_extends


def load_spec(name: str, overrides: tuple[str, ...] | list[str] = ()) -> Spec:
    """Find, merge, override and validate a spec, including its wiring (raises
    `SpecError` for any mistake, before anything runs)."""
    path = find_spec(name)
    origins = Origins()
    data = load_with_extends(path, origins)
    for text in overrides:
        apply_override(data, origins, text)
    spec = build_spec(data, origins, str(path))
    build_graph(spec)
    return spec
