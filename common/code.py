"""Code fingerprints: what makes a stage's code part of its result keys.

A stage's result depends on its code, not only on its config and inputs. Its
fingerprint is a digest of the module that defines it and of every module of the
result-computing packages (``stages`` and ``envs``, and the stage module's own
top-level package) that it imports, directly or through others, at module level
or inside a function, or names: a registry's ``"module:attribute"`` target
(`common.choices.Choice`) and ``import_module("module")`` count as imports, so an
engine, estimator or loss chosen by name in a spec is part of the key of every
stage that can choose it. Each module counts as its syntax tree without docstrings,
so comments, docstrings and formatting change nothing, while any change to what
the code does (a constant, an operator, a renamed variable) changes the key of
every stage that can reach it and, through their keys, of everything downstream.

The config and storage machinery (``common``, ``catalog``) is left out: it
checks and stores results, it does not compute them. A change there that does
change results (a trajectory schema, say) is the case for a stage's ``version``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
from functools import cache
from pathlib import Path

#: the packages whose modules compute results
COMPUTING = ("stages", "envs")

#: a string naming an implementation: ``"package.module:attribute"``
_TARGET = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*")


@cache
def _source(module: str) -> Path | None:
    """The file of `module`, or None when it is not a Python source file of a package
    on the path. Found from the top-level package's folder, so nothing is imported
    (``find_spec`` of a dotted name imports its parents, and a name such as
    ``stages.rl.losses.aggregate`` would import torch)."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") and not rest else None
    folder = Path(next(iter(spec.submodule_search_locations)))
    parts = rest.split(".") if rest else []
    for candidate in (
        folder.joinpath(*parts).with_suffix(".py") if parts else None,
        folder.joinpath(*parts, "__init__.py"),
    ):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


@cache
def _parsed(path: Path) -> tuple[str, tuple[str, ...]]:
    """(the digest of a module's tree without docstrings, the modules it imports)."""
    tree = ast.parse(path.read_text())
    package = path.parent
    imported: list[str] = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this file's package
                parts = _package_name(package).split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            imported += [base, *(f"{base}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = _TARGET.fullmatch(node.value)
            if named:
                imported.append(named.group(1))
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            imported.append(node.args[0].value)
    digest = hashlib.sha256(ast.dump(tree, annotate_fields=False, include_attributes=False).encode()).hexdigest()
    return digest, tuple(imported)


def _package_name(folder: Path) -> str:
    parts = []
    while (folder / "__init__.py").exists():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts))


def closure(module: str, packages: tuple[str, ...] = COMPUTING) -> list[str]:
    """`module` and every module of `packages` it reaches through imports, sorted."""
    roots = {*packages, module.split(".")[0]}
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in roots:
            continue
        path = _source(name)
        if path is None:
            continue
        seen.add(name)
        todo += [m for m in _parsed(path)[1] if m not in seen]
    return sorted(seen)


@cache
def fingerprint(module: str, packages: tuple[str, ...] = COMPUTING) -> str:
    """The digest of `module`'s code closure (see the module docstring). Computed once
    a process, as the files it reads are (a process's code does not change under it;
    `forget` is for one that rewrites a module it already fingerprinted)."""
    h = hashlib.sha256()
    for name in closure(module, packages):
        path = _source(name)
        assert path is not None
        h.update(f"{name}:{_parsed(path)[0]}\n".encode())
    return h.hexdigest()[:16]


def forget() -> None:
    """Read every module's file again at the next fingerprint (a test that rewrites one)."""
    for cached in (_source, _parsed, fingerprint):
        cached.cache_clear()
