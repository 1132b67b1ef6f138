"""Reading spec files: YAML with duplicate-key detection, spec-file lookup under
``configs/``, ``extends:`` chains, and the record of which file set which key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from common.errors import SpecError, did_you_mean

#: Where a bare spec name is looked up after the path as given.
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: the experiment recipes behind single results (configs/experiments/README.md), found by
#: name as the presets above them are
REPO_EXPERIMENTS = REPO_CONFIGS / "experiments"


class StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects a key given twice in one mapping."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str):
            shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else f"a {type(key).__name__}"
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"keys must be text, got {shown!r} (quote it)"
                if isinstance(key_node, yaml.ScalarNode)
                else f"keys must be text, got {shown}",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key '{key}' is given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def find_spec(name: str, relative_to: Path | None = None) -> Path:
    """The spec file for `name`: the path as given (or beside the extending file),
    else under ``./configs/``, the project's ``configs/`` and its ``configs/experiments/``;
    ``.yaml`` optional."""
    bases = [Path.cwd()] if relative_to is None else [relative_to]
    bases += [Path.cwd() / "configs", REPO_CONFIGS, REPO_EXPERIMENTS]
    names = [name] if name.endswith((".yaml", ".yml")) else [name, f"{name}.yaml"]
    for base in bases:
        for n in names:
            candidate = (base / n).expanduser()
            if candidate.is_file():
                return candidate.resolve()
            if candidate.is_dir():
                raise SpecError(name, "", f"{candidate} is a directory; expected a spec file (YAML)")
    looked = ", ".join(dict.fromkeys(str(b) for b in bases))
    raise SpecError(name, "", f"spec file not found (looked in {looked})")


#: the largest spec file read (a spec is a page of settings; this is far beyond any)
MAX_SPEC_BYTES = 1 << 20
#: the deepest nesting of mappings and lists a spec may have
MAX_DEPTH = 32
#: the most values (mappings, lists, scalars) a YAML document may hold once every
#: alias is expanded: a spec has a few hundred; an alias bomb has billions
MAX_NODES = 100_000
#: the most preset files one spec may include, counting repeats (a diamond counts twice)
MAX_INCLUDES = 64
#: the longest chain of presets extending presets
MAX_EXTENDS_DEPTH = 16
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def read_yaml(path: Path) -> dict[str, Any]:
    """One spec file as a mapping (empty file -> {})."""
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(
                str(path),
                "",
                f"the file is {size / 2**20:.1f} MiB; a spec may be at most {MAX_SPEC_BYTES // 2**20} MiB",
            )
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), "", f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read the file: {exc.strerror or exc}") from None
    if not text.strip():
        raise SpecError(str(path), "", "the file is empty (a spec has at least `pipeline:` or `extends:`)")
    bad = _CONTROL.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise SpecError(
            str(path),
            "",
            f"line {line}, column {column}: control character U+{ord(bad.group()):04X} (a spec is plain text)",
        )
    try:
        data = load_bounded(text, str(path))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1}: " if mark else ""
        raise SpecError(str(path), "", f"{at}invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise SpecError(str(path), "", f"invalid YAML: {' '.join(str(exc).split())[:200]}") from None
    except RecursionError:
        raise SpecError(str(path), "", f"nested deeper than {MAX_DEPTH} levels") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(str(path), "", f"expected a mapping at the top level, got {type(data).__name__}")
    return unshare(data)


def load_bounded(text: str, source: str) -> Any:
    """One YAML document, read with `StrictLoader` after its composed graph is
    measured: a document that would expand (through aliases) to more than
    `MAX_NODES` values, or nest deeper than `MAX_DEPTH`, or refer to itself, is a
    `SpecError` before anything walks it. YAML errors propagate."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            size, depth = _measure(node, {}, set())
        except _SelfReference:
            raise SpecError(source, "", "an alias refers to the value that contains it") from None
        if depth > MAX_DEPTH:
            raise SpecError(source, "", f"nested deeper than {MAX_DEPTH} levels")
        if size > MAX_NODES:
            raise SpecError(
                source, "", f"expands to more than {MAX_NODES:,} values through its aliases (a spec has a few hundred)"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


class _SelfReference(Exception):
    pass


def _measure(node: yaml.Node, memo: dict[int, tuple[int, int]], active: set[int]) -> tuple[int, int]:
    """(values once expanded, nesting depth) of a composed node; shared (aliased)
    nodes are measured once, so this costs the size of the text, not of its expansion."""
    ident = id(node)
    if ident in memo:
        return memo[ident]
    if ident in active:
        raise _SelfReference
    if isinstance(node, yaml.ScalarNode):
        return 1, 0
    children: list[yaml.Node] = (
        [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
    )
    active.add(ident)
    size, depth = 1, 0
    for child in children:
        s, d = _measure(child, memo, active)
        size, depth = min(size + s, MAX_NODES + 1), max(depth, d + 1)
        if depth > MAX_DEPTH:
            break
    active.discard(ident)
    memo[ident] = (size, depth)
    return size, depth


def unshare(value: Any) -> Any:
    """A copy in which every YAML alias (``*agent``) is a separate object, so that
    an override of one place changes only that place."""
    if isinstance(value, dict):
        return {k: unshare(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unshare(v) for v in value]
    return value


class Origins:
    """Which source (a file, or a ``-o`` override) set each key path."""

    def __init__(self) -> None:
        self._by_path: dict[str, str] = {}

    def record(self, data: Any, source: str, prefix: str = "") -> None:
        self._by_path.pop(prefix, None)  # keep the dict in the order keys were (last) set
        self._by_path[prefix] = source  # "" is the file that was loaded last: the user's own
        if isinstance(data, dict):
            for k, v in data.items():
                self.record(v, source, f"{prefix}.{k}" if prefix else str(k))

    def set_by(self, path: str) -> str | None:
        """The source that last set `path` itself or a key inside it; None when no
        file or override set it (its value is the default)."""
        latest = None
        for p, src in self._by_path.items():
            if path and (p == path or p.startswith((path + ".", path + "["))):
                latest = src
        return latest

    def where(self, path: str) -> str:
        """The source that last set `path` or a key inside it (a section named by a
        cross-field check: `-o eval.agent.think=...` is why `eval.agent` is wrong), else
        else the source that last set its nearest ancestor or something in it (a key
        nobody set is wrong because of what was set beside it: `-o pipeline.eval.stage=x`
        is why `pipeline.eval.outputs` now clashes)."""
        probe = path
        while probe:
            latest = self.set_by(probe)  # in the order they were set: the last one wins
            if latest is not None:
                return latest
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        return self._by_path.get("", "<spec>")

    def blame(self, path: str, message: str) -> str:
        """The source to name for a check that failed at `path` with `message`: of
        `path` and every key path the message mentions (a cross-node check names the
        other node's key, e.g. ``rollout.group_size``), the one set last, so that an
        override that caused the problem is named rather than the preset."""
        mentioned = re.findall(r"\b[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+\b", message)
        return self.where(self.latest([path, *mentioned]))

    def latest(self, paths: list[str]) -> str:
        """Of `paths`, the one whose value (or a key inside it) was set last; the first
        when none was set."""
        order = {p: i for i, p in enumerate(self._by_path)}
        best, best_at = paths[0], -1
        for candidate in paths:
            at = max(
                (i for p, i in order.items() if p == candidate or p.startswith((candidate + ".", candidate + "["))),
                default=-1,
            )
            if at > best_at:
                best, best_at = candidate, at
        return best


def reset_switched(base: dict[str, Any], child: dict[str, Any], dropped: list[str] | None = None) -> dict[str, Any]:
    """`base` without the settings that `child` makes meaningless by switching what they
    belong to (the rules, docs/guide.md#extends-and-overrides):

    - a section's ``env`` changed: its ``env_options`` (the old environment's; options
      given beside the new ``env`` are the only ones);
    - a section's ``envs`` changed: its ``env_options`` of environments no longer listed;
    - a node's ``stage`` changed: its ``inputs``, ``outputs`` and its config section (the
      old stage's settings).

    Any other setting `child` gives is merged as always. The key paths dropped are added
    to `dropped` (their value is now the one `child` implies)."""
    dropped = [] if dropped is None else dropped
    out = dict(base)
    for name, own in child.items():
        old = out.get(name)
        if isinstance(own, dict) and isinstance(old, dict):
            out[name] = _reset_section(old, own)
            if out[name] is not old:
                dropped.append(f"{name}.env_options")
    nodes, old_nodes = child.get("pipeline"), base.get("pipeline")
    if isinstance(nodes, dict) and isinstance(old_nodes, dict):
        kept = dict(old_nodes)
        for node, own in nodes.items():
            old = old_nodes.get(node)
            if not (isinstance(own, dict) and isinstance(old, dict) and "stage" in own):
                continue
            if (own.get("stage") or node) != (old.get("stage") or node):
                kept[node] = {k: v for k, v in old.items() if k not in ("inputs", "outputs", "config")}
                dropped += [f"pipeline.{node}.{k}" for k in ("inputs", "outputs", "config") if k in old]
                section = old.get("config") or node
                if section not in child and section == node and section in out:  # a shared one stays
                    out.pop(section)
                    dropped.append(section)
        out["pipeline"] = kept
    return out


def _reset_section(old: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    options = old.get("env_options")
    if options is None:
        return old
    if "env" in own and own["env"] != old.get("env"):
        return {k: v for k, v in old.items() if k != "env_options"}
    envs = own.get("envs")
    if isinstance(envs, list) and isinstance(options, dict) and envs != old.get("envs"):
        return {**old, "env_options": {k: v for k, v in options.items() if k in envs}}
    return old


def deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` over `base`: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for k, v in child.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check_removals(base: dict[str, Any], child: dict[str, Any], source: str) -> None:
    """A ``pipeline.<node>: null`` in `child` removes a node of `base`; one that names no
    node there is a typo (it would remove nothing, without a word), a `SpecError`."""
    nodes = child.get("pipeline")
    if not isinstance(nodes, dict):
        return
    found = base.get("pipeline")
    existing: dict[str, Any] = found if isinstance(found, dict) else {}
    for name, value in nodes.items():
        if value is None and existing.get(name) is None:
            live = [str(n) for n, v in existing.items() if v is not None]
            raise SpecError(
                source,
                f"pipeline.{name}",
                f"null removes a node, but no node '{name}' is defined before this{did_you_mean(str(name), live)}",
            )


class _Includes:
    """The budget of one spec's `extends` graph: files read once, inclusions counted."""

    def __init__(self, top: Path) -> None:
        self.allowed = [top.parent.resolve(), (Path.cwd() / "configs").resolve(), REPO_CONFIGS]
        self.read: dict[Path, dict[str, Any]] = {}
        self.count = 0

    def inside(self, path: Path) -> bool:
        return path.suffix in (".yaml", ".yml") and any(path.is_relative_to(a) for a in self.allowed)


def load_with_extends(
    path: Path, origins: Origins, chain: tuple[Path, ...] = (), includes: _Includes | None = None
) -> dict[str, Any]:
    """The merged content of `path` and the presets it extends, recording origins.
    A preset is a YAML file beside the spec (or below its folder) or under a
    ``configs/`` folder; each is read once, at most `MAX_INCLUDES` inclusions and
    `MAX_EXTENDS_DEPTH` levels."""
    includes = includes or _Includes(path)
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise SpecError(str(path), "extends", f"extends itself in a cycle ({cycle})")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise SpecError(str(chain[0]), "extends", f"presets extend presets more than {MAX_EXTENDS_DEPTH} levels deep")
    includes.count += 1
    if includes.count > MAX_INCLUDES:
        raise SpecError(
            str(chain[0] if chain else path), "extends", f"includes presets more than {MAX_INCLUDES} times in all"
        )
    if path not in includes.read:
        includes.read[path] = read_yaml(path)
    data = dict(includes.read[path])
    parents = data.pop("extends", None)
    if parents is None:
        parents = []
    elif isinstance(parents, str):
        parents = [parents]
    elif not (isinstance(parents, list) and all(isinstance(p, str) for p in parents)):
        raise SpecError(str(path), "extends", "expected a file name or a list of file names")
    merged: dict[str, Any] = {}
    for parent in parents:
        try:
            parent_path = find_spec(parent, relative_to=path.parent)
        except SpecError:
            raise SpecError(
                str(path), "extends", f"preset {_shown(parent)} not found (beside the file or under configs/)"
            ) from None
        if not includes.inside(parent_path):
            raise SpecError(
                str(path),
                "extends",
                f"preset {_shown(parent)} is not a YAML file beside the spec or under configs/ (presets are read "
                "only from there)",
            )
        merged = deep_merge(merged, load_with_extends(parent_path, origins, (*chain, path), includes))
    check_removals(merged, data, str(path))
    dropped: list[str] = []
    merged = reset_switched(merged, data, dropped)
    for key in dropped:
        origins.record(None, str(path), key)
    origins.record(data, str(path))
    out = deep_merge(merged, data)
    return unshare(out) if not chain else out


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 80 else repr(name[:77] + "...")
