"""`pipeline explain SPEC [KEY]`: every setting of a loaded spec with its value, its
doc, its bounds, the paper's value where there is one, and where the value came
from (a file, a preset, an ``-o`` override, or the default).

    $ pipeline explain starpo.yaml rollout.n_groups
    rollout.n_groups = 16    [configs/starpo.yaml]
        initial states (groups) per iteration; >= 1; paper: 8

Settings are the fields of the typed sections (`run`, `catalog`, `ray`, `warnings`,
`tracking`) and of every node's config section, nested sections included; each
section is shown once even when several nodes share it (``eval_start`` and
``eval``). The docs are the ones `common.config.param` declares.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from common.config import bounds_text
from common.errors import UserError, did_you_mean
from pipelines.spec.build import SHARED, NodeSection, Spec
from pipelines.spec.typed import type_name


@dataclass(frozen=True)
class Setting:
    """One setting of a loaded spec."""

    path: str
    value: Any
    type: str
    doc: str
    bounds: str
    paper: Any
    source: str  # the file or override that set it, or "default"


def _shown(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _source(spec: Spec, path: str) -> str:
    """What set `path`: its own key, else a top-level shared section (`agent:`), else the default."""
    own = spec.origins.set_by(path)
    if own is not None:
        return own
    _, _, rest = path.partition(".")
    if rest.split(".")[0] in SHARED:
        shared = spec.origins.set_by(rest)
        if shared is not None:
            return f"{rest.split('.')[0]}: {shared}"
    return "default"


def _walk(obj: Any, prefix: str, spec: Spec) -> Iterator[Setting]:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        path, value = f"{prefix}.{f.name}", getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and f.metadata.get("doc") is not None:
            yield from _walk(value, path, spec)
            continue
        meta = f.metadata
        yield Setting(
            path,
            value,
            type_name(hints[f.name]),
            str(meta.get("doc", "")),
            bounds_text(meta),
            meta.get("paper"),
            _source(spec, path),
        )


def settings(spec: Spec) -> list[Setting]:
    """Every setting of `spec`, section by section (module docstring)."""
    out: list[Setting] = []
    for section in ("run", "catalog", "ray", "warnings", "tracking"):
        out += _walk(getattr(spec, section), section, spec)
    # a shared section (`agent:`) shows as the stages that read it
    seen: set[str] = set()
    for node in spec.nodes:
        section = node.section or node.name
        if section in seen or node.config is None or not dataclasses.is_dataclass(node.config):
            continue
        seen.add(section)
        out += _walk(node.config, section, spec)
    return out


def recorded(spec: Spec) -> str:
    """Every setting's value (as `explain` shows it) and source, as JSON ({path:
    {"value", "source"}}): kept in the run's record (the `runs` view's ``settings``),
    what `pipeline diff` compares."""
    return json.dumps({s.path: {"value": _shown(s.value), "source": s.source} for s in settings(spec)})


#: settings that name, seed or place a run rather than say what it computes
_PLACE = ("run.name", "run.seed", "catalog.", "ray.", "tracking.")


def comparable(settings_of: dict[str, dict[str, str]]) -> dict[str, str]:
    """path -> value of recorded settings (`recorded`, parsed), without those that
    name, seed or place a run: two runs of one recipe at two seeds compare equal (how
    a sweep report finds its default level, `pipelines.report.levels`)."""
    return {
        p: str(v.get("value"))
        for p, v in settings_of.items()
        if isinstance(v, dict) and not any(p == x or p.startswith(x) for x in _PLACE)
    }


def _pipeline(spec: Spec) -> list[Setting]:
    """The ``pipeline:`` section as settings: each node's stage, schedule and wiring
    (shown by `explain`; not part of a run's `recorded` settings, which its results'
    keys and `pipeline diff` already cover)."""
    hints = typing.get_type_hints(NodeSection)
    docs = {f.name: f.metadata for f in dataclasses.fields(NodeSection)}
    out = []
    for node in spec.nodes:
        values = {
            "stage": node.stage.name,
            "once": node.once,
            "every": node.every,
            "inputs": dict(node.inputs),
            "outputs": dict(node.outputs),
            "config": node.section or node.name,
        }
        for name, value in values.items():
            path = f"pipeline.{node.name}.{name}"
            meta = docs[name]
            out.append(
                Setting(
                    path,
                    value,
                    type_name(hints[name]),
                    str(meta.get("doc", "")),
                    bounds_text(meta),
                    None,
                    spec.origins.set_by(path) or "default",
                )
            )
    return out


def _matches(path: str, key: str) -> bool:
    """Whether `path` is at or under `key`; a shared section's key (`agent`,
    `agent.max_turns`) matches it in every stage that reads it (`rollout.agent...`)."""
    if path == key or path.startswith(key + "."):
        return True
    rest = path.partition(".")[2]
    return key.split(".")[0] in SHARED and (rest == key or rest.startswith(key + "."))


def explain(spec: Spec, key: str | None = None) -> str:
    """The text `pipeline explain` prints: every setting, or those at or under `key`
    (a section, a shared section as each stage reads it, a node of ``pipeline:``)."""
    rows = settings(spec) + _pipeline(spec)
    if key:
        rows = [s for s in rows if _matches(s.path, key)]
        if not rows:
            every = [s.path for s in settings(spec) + _pipeline(spec)] + list(SHARED)
            sections = sorted({p.split(".")[0] for p in every})
            hint = did_you_mean(key, every + sections)
            if "did you mean" not in hint:  # no near key: the sections, each explained on its own
                hint = f" (the sections are {', '.join(sections)})"
            raise UserError(f"explain {key}: no such setting in {spec.file}{hint}")
    if key and key.split(".")[0] in SHARED and not any(_at(s.path, key) for s in rows):
        rows = _as_shared(spec, rows)
    lines = []
    for s in rows:
        lines.append(f"{s.path} = {_shown(s.value)}    [{s.source}]")
        extra = [x for x in (s.type, s.bounds, f"paper: {_shown(s.paper)}" if s.paper is not None else "") if x]
        lines.append(f"    {s.doc}" + (f" ({'; '.join(extra)})" if extra else ""))
    return "\n".join(lines)


def _at(path: str, key: str) -> bool:
    return path == key or path.startswith(key + ".")


def _as_shared(spec: Spec, rows: list[Setting]) -> list[Setting]:
    """A shared section's settings (`agent.max_turns`) as written at the top level, once,
    each with the value most of its stages read; after it, the stages that read another
    value, by their own path (`eval.agent.max_turns`)."""
    by_path: dict[str, list[Setting]] = {}
    for s in rows:
        by_path.setdefault(s.path.partition(".")[2], []).append(s)
    out: list[Setting] = []
    for path, copies in by_path.items():
        shown = [_shown(s.value) for s in copies]
        common = max(shown, key=shown.count)
        first = copies[shown.index(common)]
        top = spec.origins.set_by(path)
        out.append(dataclasses.replace(first, path=path, source=top if top is not None else first.source))
        out += [s for s, v in zip(copies, shown) if v != common]
    return out
