"""The rooms and their layering (docs/architecture.md), read from the source: every
import of every module, including those inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "catalog", "envs", "stages", "pipelines")
#: what each room may import besides itself (the layering, bottom to top)
ALLOWED = {
    "common": set(),
    "catalog": {"common"},
    "envs": {"common"},
    "stages": {"common", "catalog", "envs"},
    "pipelines": {"common", "catalog", "envs", "stages"},
}
#: inside stages/: what each sub-package may import besides itself and `common`, bottom
#: to top (acyclic: `test_the_stages_layering_is_acyclic`); the stage modules above them
#: (stages/*.py) import any sub-package and no other stage module
STAGES_ALLOWED = {
    "stages.rl": set(),
    "stages.models": {"catalog", "stages.rl"},
    "stages.engines": {"catalog", "stages.models", "stages.runtime", "stages.lost_nodes"},
    "stages.agent": {"catalog", "envs", "stages.engines", "stages.models", "stages.registry", "stages.rl"},
    "stages.endpoint": {"catalog", "envs", "stages.agent", "stages.engines", "stages.models", "stages.registry"},
    "stages.training": {
        "catalog",
        "envs",
        "stages.agent",
        "stages.engines",
        "stages.models",
        "stages.rl",
        "stages.runtime",
        "stages.lost_nodes",
    },
}


#: the rooms of pipelines/ (pipelines/__init__.py), bottom to top: what each may import of
#: pipelines/ besides itself; every other room (`common`, `catalog`, `envs`, `stages`) it may
PIPELINES_ALLOWED = {
    "pipelines.spec": set(),
    "pipelines.graph": {"pipelines.spec"},
    "pipelines.report": {"pipelines.spec"},
    "pipelines.run": {"pipelines.spec", "pipelines.graph", "pipelines.report"},
    "pipelines.sweep": {"pipelines.spec", "pipelines.graph", "pipelines.run"},
    "pipelines.cli": {"pipelines.spec", "pipelines.graph", "pipelines.report", "pipelines.run", "pipelines.sweep"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (a `from pkg import mod` counts as pkg.mod)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def room(module: str) -> str:
    return module.split(".")[0]


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_rooms_import_only_downwards() -> None:
    wrong = [
        f"{m} -> {d}"
        for m, deps in graph().items()
        for d in deps
        if room(d) != room(m) and room(d) not in ALLOWED[room(m)]
    ]
    assert wrong == []


def _part(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_stage_sub_packages_keep_their_roles() -> None:
    wrong = []
    for m, deps in graph().items():
        if _part(m) not in STAGES_ALLOWED:
            continue
        for d in deps:
            target = _part(d) if room(d) == "stages" else room(d)
            if target not in (_part(m), "common") and target not in STAGES_ALLOWED[_part(m)]:
                wrong.append(f"{m} -> {d}")
    assert wrong == []


def test_pipelines_rooms_keep_their_layering() -> None:
    wrong = []
    for m, deps in graph().items():
        if room(m) != "pipelines" or m == "pipelines":
            continue
        assert _part(m) in PIPELINES_ALLOWED, f"{m}: a module of pipelines/ outside its rooms"
        for d in deps:
            if room(d) == "pipelines" and _part(d) not in (_part(m), *PIPELINES_ALLOWED[_part(m)]):
                wrong.append(f"{m} -> {d}")
    assert wrong == []
    assert cycles({r: set(a) for r, a in PIPELINES_ALLOWED.items()}) == []


def test_every_room_says_what_it_holds() -> None:
    rooms = [ROOT / r.replace(".", "/") / "__init__.py" for r in (*PACKAGES, *STAGES_ALLOWED, *PIPELINES_ALLOWED)]
    unsaid = [str(p.relative_to(ROOT)) for p in rooms if not ast.get_docstring(ast.parse(p.read_text()))]
    assert unsaid == []


#: modules that share a basename on purpose: a stage and the model code it drives
#: (stages/X.py and stages/models/X.py), one registry per package, one protocol per package
SAME_NAME = [
    {"stages.critic", "stages.models.critic"},
    {"stages.policy", "stages.models.policy"},
    {"stages.training.pretrain", "stages.pretrain"},
    {"stages.mutual_info", "stages.rl.mutual_info"},
    {"envs.registry", "stages.registry"},
    {"envs.registry", "stages.rl.registry"},
    {"stages.registry", "stages.rl.registry"},
    {"envs.base", "stages.engines.base"},
    # a CLI module is named after what its commands act on
    {"pipelines.cli.spec", "pipelines.spec"},
    {"pipelines.cli.catalog", "catalog"},
    {"pipelines.cli.models", "stages.models"},
    {"pipelines.cli.run", "pipelines.run"},
]


def test_no_two_module_names_a_letter_apart() -> None:
    import difflib

    # every pair of modules, same basename included (models/policy.py and policy.py are
    # the stage and its model: allowed where they are in different packages of stages/)
    named = sorted((n.rsplit(".", 1)[-1], n) for n in modules() if not n.endswith("__init__"))
    close = [
        (m, n)
        for i, (a, m) in enumerate(named)
        for b, n in named[i + 1 :]
        if len(a) > 3 and difflib.SequenceMatcher(None, a, b).ratio() > 0.9 and {m, n} not in SAME_NAME
    ]
    assert close == []


def test_the_stages_layering_is_acyclic() -> None:
    table = {part: {d for d in deps if d in STAGES_ALLOWED} for part, deps in STAGES_ALLOWED.items()}
    assert cycles(table) == []


def test_no_stage_module_imports_another() -> None:
    import stages  # noqa: F401  (registers the stages)
    from stages.registry import STAGES

    stage_modules = {s.fn.__module__ for s in STAGES.values() if s.fn.__module__.startswith("stages.")}
    wrong = [f"{m} -> {d}" for m, deps in graph().items() if m in stage_modules for d in deps if d in stage_modules]
    assert stage_modules and wrong == []


def test_scripts_import_the_packages_never_another_script() -> None:
    """bench/ and experiments/ (docs/architecture.md, "Scripts"): what two scripts share
    lives in a package, so no import runs between them or upwards."""
    folders = ("bench", "experiments")
    wrong = []
    for folder in folders:
        for path in sorted((ROOT / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else ["."]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                wrong += [f"{folder}/{path.name}: {n}" for n in names if n == "." or n.split(".")[0] in folders]
    assert wrong == []
