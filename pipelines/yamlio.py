"""Reading spec files: YAML with duplicate-key detection, spec-file lookup under
``configs/``, ``extends:`` chains, and the record of which file set which key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from common.errors import SpecError

#: Where a bare spec name is looked up after the path as given.
REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


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
    else under ``./configs/`` and the project's ``configs/``; ``.yaml`` optional."""
    bases = [Path.cwd()] if relative_to is None else [relative_to]
    bases += [Path.cwd() / "configs", REPO_CONFIGS]
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
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1}: " if mark else ""
        raise SpecError(str(path), "", f"{at}invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise SpecError(str(path), "", f"invalid YAML: {' '.join(str(exc).split())[:200]}") from None
    except RecursionError:
        raise SpecError(str(path), "", f"nested deeper than {MAX_DEPTH} levels") from None
    if nesting_depth(data) > MAX_DEPTH:
        raise SpecError(str(path), "", f"nested deeper than {MAX_DEPTH} levels")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(str(path), "", f"expected a mapping at the top level, got {type(data).__name__}")
    return _unshare(data)


def nesting_depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max((nesting_depth(v, level + 1) for v in children), default=level)


def _unshare(value: Any) -> Any:
    """A copy in which every YAML alias (``*agent``) is a separate object, so that
    an override of one place changes only that place."""
    if isinstance(value, dict):
        return {k: _unshare(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshare(v) for v in value]
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

    def where(self, path: str) -> str:
        """The source that last set `path` or a key inside it (a section named by a
        cross-field check: `-o eval.agent.think=...` is why `eval.agent` is wrong), else
        the source of its nearest ancestor that has one."""
        latest = None
        for p, src in self._by_path.items():  # in the order they were set: the last one wins
            if path and (p == path or p.startswith((path + ".", path + "["))):
                latest = src
        if latest is not None:
            return latest
        probe = path
        while probe:
            if probe in self._by_path:
                return self._by_path[probe]
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        return self._by_path.get("", "<spec>")

    def blame(self, path: str, message: str) -> str:
        """The source to name for a check that failed at `path` with `message`: of
        `path` and every key path the message mentions (a cross-node check names the
        other node's key, e.g. ``rollout.group_size``), the one set last, so that an
        override that caused the problem is named rather than the preset."""
        order = {p: i for i, p in enumerate(self._by_path)}
        best, best_at = self.where(path), -1
        for candidate in [path, *re.findall(r"\b[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+\b", message)]:
            at = max(
                (i for p, i in order.items() if p == candidate or p.startswith((candidate + ".", candidate + "["))),
                default=-1,
            )
            if at > best_at:
                best, best_at = self.where(candidate), at
        return best


def deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` over `base`: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for k, v in child.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_with_extends(path: Path, origins: Origins, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The merged content of `path` and the presets it extends, recording origins."""
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise SpecError(str(path), "extends", f"extends itself in a cycle ({cycle})")
    data = read_yaml(path)
    parents = data.pop("extends", None)
    if parents is None:
        parents = []
    elif isinstance(parents, str):
        parents = [parents]
    elif not (isinstance(parents, list) and all(isinstance(p, str) for p in parents)):
        raise SpecError(str(path), "extends", f"expected a file name or a list of file names, got {parents!r}")
    merged: dict[str, Any] = {}
    for parent in parents:
        try:
            parent_path = find_spec(parent, relative_to=path.parent)
        except SpecError:
            raise SpecError(
                str(path), "extends", f"preset '{parent}' not found (beside the file or under configs/)"
            ) from None
        merged = deep_merge(merged, load_with_extends(parent_path, origins, (*chain, path)))
    origins.record(data, str(path))
    return deep_merge(merged, data)
