"""The spec: YAML files -> one validated, frozen `Spec`.

A spec file has these top-level keys::

    extends: starpo.yaml        # presets this file builds on (merged first)
    run: {name, iterations, seed}
    catalog: {root}
    ray: {address, num_cpus}
    warnings: {std_drop: 0.5, ...}   # early warnings of collapse (pipelines.run.watch)
    pipeline:                   # the stages, in order, and how they are wired
      rollout: {stage: rollout, inputs: {policy: policy@prev}}
      ...
    rollout: {...}              # the config of the node named 'rollout'

Every other top-level key must name a node of ``pipeline`` (or a section that a
node names with ``config:``) and holds that node's stage config. ``-o dotted.key=value`` overrides any key (the value is read as YAML:
``-o update.optim.lr=1e-5``, ``-o pipeline.eval=null`` removes a node).
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from catalog.manifests import is_name
from common.config import param
from common.errors import SpecError
from pipelines.spec import typed
from pipelines.spec.rules import WarningsSection
from pipelines.spec.trackers import TrackingSection
from pipelines.spec.yamlio import MAX_DEPTH, Origins, check_removals, load_bounded, reset_switched, unshare
from stages.registry import STAGES, StageDef

RESERVED = ("extends", "run", "catalog", "ray", "warnings", "tracking", "pipeline", "agent", "imports")
#: top-level sections that set the config field of the same name of every stage that
#: has one (warmstart, pretrain, rollout and eval read `agent:`); a stage's own keys
#: in its section override them
SHARED = ("agent",)
NODE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")
#: the largest run seed: NumPy's and torch's generators take every seed a step derives from it
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class RunSection:
    """`run:` — what this run is called and how long it goes."""

    name: str | None = param(None, "run name in the catalog; default: the spec file's name", key=False)
    iterations: int = param(1, "iterations of the per-iteration stages", ge=0)
    seed: int = param(0, "run seed; every stage derives its randomness from it and the iteration", ge=0, le=MAX_SEED)
    concurrency: int = param(
        1,
        "steps that may run at once: 1 walks the plan in order; more runs every step whose inputs are "
        "committed, one per host (engine actors, this process), e.g. the next rollout beside the update when "
        "it reads an older policy (policy@prev:2); same keys and results either way",
        ge=1,
        le=8,
        key=False,
    )


@dataclass(frozen=True)
class CatalogSection:
    """`catalog:` — where results are kept."""

    root: str | None = param(None, "local folder or pyarrow URI; default $PIPELINE_CATALOG or ./pipeline-data")


@dataclass(frozen=True)
class RaySection:
    """`ray:` — which Ray to use (started only when a stage needs it)."""

    address: str | None = param(None, "Ray cluster address; default $RAY_ADDRESS, else a local Ray")
    num_cpus: int | None = param(None, "CPUs for a local Ray; default all", ge=1)


@dataclass(frozen=True)
class NodeSection:
    """`pipeline.<node>:` — one stage of the pipeline."""

    stage: str | None = param(None, "registered stage name; default: the node's name")
    once: bool = param(False, "run once before the iterations (e.g. a warm start) instead of every iteration")
    every: int = param(1, "run on iterations 0, every, 2*every, ... and the last (sinks only, e.g. eval)", ge=1)
    inputs: dict[str, str] | None = param(
        None, "stage input -> dataset ('name'; 'name@prev': the previous iteration's; 'name@once': the once-stage's)"
    )
    outputs: dict[str, str] | None = param(None, "stage output -> dataset name; default: the output's own name")
    config: str | None = param(
        None,
        "the section holding this node's config; default: the node's name "
        "(e.g. a once-eval sharing the 'eval' section)",
    )


@dataclass(frozen=True)
class NodeSpec:
    """A validated node: its stage, its config object and its (unresolved) wiring."""

    name: str
    stage: StageDef
    once: bool
    every: int
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    config: Any
    section: str = ""  # the section its config came from ('' = its name)


@dataclass(frozen=True)
class Spec:
    """A loaded spec. `resolved` is the merged YAML after overrides (recorded with
    each run); `origins.where(path)` names the file that set a key."""

    file: str
    name: str
    run: RunSection
    catalog: CatalogSection
    ray: RaySection
    warnings: WarningsSection
    tracking: TrackingSection
    nodes: tuple[NodeSpec, ...]
    resolved: Mapping[str, Any]
    origins: Origins

    def resolved_yaml(self) -> str:
        return yaml.safe_dump(thaw(self.resolved), sort_keys=False)


def thaw(value: Any) -> Any:
    """Plain nested dicts of a frozen mapping (the resolved spec, for hooks)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


#: the longest `-o` override read
MAX_OVERRIDE = 1 << 16


def apply_override(data: dict[str, Any], origins: Origins, text: str) -> None:
    """Apply one ``-o dotted.key=value`` to the merged spec data."""
    shown = text if len(text) <= 120 else text[:100] + "..."
    source = f"-o {shown}" if shown.isprintable() else f"-o {json.dumps(shown)}"
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise SpecError(source, "", "expected -o dotted.key=value, e.g. -o update.optim.lr=1e-5")
    if len(text) > MAX_OVERRIDE:
        raise SpecError(source, "", f"an override may be at most {MAX_OVERRIDE} characters")
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise SpecError(source, "", f"control character U+{ord(bad):04X} in the override")
    too_deep = False
    try:
        value = load_bounded(raw, source) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        value, too_deep = raw, True
    if too_deep:  # deeper than the YAML composer's own recursion (load_bounded checks the depth)
        raise SpecError(source, "", f"the value is nested deeper than {MAX_DEPTH} levels")
    value = unshare(value)
    parts = key.split(".")
    if parts[0] == "pipeline":  # `-o pipeline.evl=null` (a typo) would remove nothing
        check_removals(data, _nested(parts, value), source)
    dropped: list[str] = []
    switched = reset_switched(data, _nested(parts, value), dropped)  # `-o rollout.env=x`: the old env's options go
    data.clear()
    data.update(switched)
    for path in dropped:
        origins.record(None, source, path)
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            at = ".".join(parts[: i + 1])
            raise SpecError(source, at, f"is {typed.type_name(type(child))}, not a section with keys")
        node = child
    node[parts[-1]] = value
    origins.record(value, source, key)


def _nested(parts: list[str], value: Any) -> dict[str, Any]:
    """``{a: {b: value}}`` for the key path ``a.b``."""
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return out


def _merged(base: Any, own: Any) -> Any:
    """`own` over `base`, key by key inside mappings."""
    if isinstance(base, Mapping) and isinstance(own, Mapping):
        return {**base, **{k: _merged(base.get(k), v) for k, v in own.items()}}
    return base if own is None else own


def _with_shared(cls: type, data: Mapping[str, Any], section: str) -> Any:
    """The data of `section` with the top-level `SHARED` sections filled in for the
    config fields of `cls` that they name."""
    raw = data.get(section)
    fields = {f.name for f in dataclasses.fields(cls)}
    for name in SHARED:
        if name in data and name in fields and (raw is None or isinstance(raw, Mapping)):
            raw = {**(raw or {}), name: _merged(data[name], (raw or {}).get(name))}
    return raw


def _check_shared(data: Mapping[str, Any], stages: list[StageDef], where: typed.Where) -> None:
    """Each top-level shared section on its own (a mistake is named at its own key),
    and read by some stage of the pipeline."""
    for name in SHARED:
        if name not in data:
            continue
        users = [s.config for s in stages if name in {f.name for f in dataclasses.fields(s.config)}]
        if not users:
            raise SpecError(where(name), name, f"no stage of this pipeline has a '{name}' setting")
        typed.build(typing.get_type_hints(users[0])[name], data[name], name, where)


def _stage_name(node: str, raw: Any) -> Any:
    return (raw.get("stage") if isinstance(raw, Mapping) else None) or node


def _build_node(name: str, raw: Any, data: Mapping[str, Any], where: typed.Where) -> NodeSpec:
    path = f"pipeline.{name}"
    if not NODE_NAME.match(name):
        raise SpecError(where(path), path, "a node name must be a word of letters, digits, '_' or '-'")
    if name in RESERVED:
        raise SpecError(where(path), path, f"'{name}' is a reserved section name; name the node otherwise")
    section = typed.build(NodeSection, raw, path, where)
    stage_name = section.stage or name
    if stage_name not in STAGES:
        at = f"{path}.stage" if section.stage else path
        raise SpecError(where(at), at, f"unknown stage '{stage_name}'{typed.did_you_mean(stage_name, STAGES)}")
    stage = STAGES[stage_name]
    if section.once and section.every != 1:
        raise SpecError(where(f"{path}.every"), f"{path}.every", "a once-stage cannot also run every N iterations")
    section_name = section.config or name
    if section.config and section.config in RESERVED:
        raise SpecError(where(f"{path}.config"), f"{path}.config", f"'{section.config}' is a reserved section")
    if section.config and section.config != name and name in data:
        raise SpecError(
            where(name),
            name,
            f"node '{name}' takes its config from section '{section.config}' "
            f"(pipeline.{name}.config): set the keys there",
        )
    config = typed.build(stage.config, _with_shared(stage.config, data, section_name), section_name, where)
    return NodeSpec(
        name=name,
        stage=stage,
        once=section.once,
        every=section.every,
        inputs=MappingProxyType(dict(section.inputs or {})),
        outputs=MappingProxyType(dict(section.outputs or {})),
        config=config,
        section=section_name,
    )


def build_spec(data: dict[str, Any], origins: Origins, file: str) -> Spec:
    """Validate merged spec data (after `extends` and overrides) into a `Spec`."""
    where = origins.where
    pipeline = data.get("pipeline")
    if not isinstance(pipeline, dict) or not pipeline:
        raise SpecError(where("pipeline"), "pipeline", "expected a mapping of stage nodes (the pipeline has no stages)")
    removed = {n for n, v in pipeline.items() if v is None}  # `node: null` drops a preset's node
    node_names = [str(n) for n in pipeline if n not in removed]
    shared = {v.get("config") for v in pipeline.values() if isinstance(v, dict)}
    for key in data:
        if key not in RESERVED and key not in node_names and key not in removed and key not in shared:
            options = [*RESERVED[1:], *node_names]
            raise SpecError(
                where(str(key)),
                str(key),
                f"unknown key: not a section nor a pipeline node{typed.did_you_mean(str(key), options)}",
            )
    run = typed.build(RunSection, data.get("run"), "run", where)
    name = unicodedata.normalize("NFC", run.name if run.name is not None else Path(file).stem)
    if not is_name(name):
        at = "run.name"
        shown = json.dumps(name, ensure_ascii=False)[:80]
        why = f"got {shown}" if run.name is not None else f"the file's name {shown} is not one; set run.name"
        raise SpecError(
            where(at) if run.name is not None else file,
            at,
            f"a run name is letters and digits of any script, '_', '.' or '-' (at most 128, not starting with '.' "
            f"or '-'; no spaces): {why}",
        )
    if run.name is not None and name != run.name:  # one spelling of a name (NFC)
        run = dataclasses.replace(run, name=name)
    stages = [STAGES[s] for n in node_names if (s := _stage_name(n, pipeline[n])) in STAGES]
    _check_shared(data, stages, where)
    nodes = tuple(_build_node(n, pipeline[n], data, where) for n in node_names)
    if not nodes:
        raise SpecError(where("pipeline"), "pipeline", "every node was removed: the pipeline has no stages")
    return Spec(
        file=file,
        name=name,
        run=run,
        catalog=typed.build(CatalogSection, data.get("catalog"), "catalog", where),
        ray=typed.build(RaySection, data.get("ray"), "ray", where),
        warnings=typed.build(WarningsSection, data.get("warnings"), "warnings", where),
        tracking=typed.build(TrackingSection, data.get("tracking"), "tracking", where),
        nodes=nodes,
        resolved=_freeze({k: v for k, v in data.items() if k not in removed}),
        origins=origins,
    )
