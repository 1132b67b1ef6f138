"""Every command and spec shown in the README and docs runs as written, checked the
cheapest way that proves it (nothing here trains a model):

- a YAML spec is loaded and validated (a fragment, one without ``pipeline:`` or
  ``extends:``, over ``starpo.yaml``); a sweep file has every trial spec checked;
- ``pipeline validate / explain / show`` run as written; ``pipeline run`` runs as
  ``pipeline show`` with the same spec, overrides and selection; ``pipeline sweep``
  checks every trial; ``pipeline query`` and SQL blocks run on an empty catalog (every
  view exists, empty); the other commands (they read a run's results) are parsed;
- ``python <script>`` commands have their arguments parsed by the script's own parser;
- Python blocks run (the hooks example with `Runner.run` replaced: it would train).

Words in CAPITALS in a command are placeholders (``HEAD:6379``, ``s3://BUCKET/...``):
a command that holds one is parsed, or run with the placeholder replaced here.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M)
#: commands a page may show that need a network, an install or a cluster: not run here
EXTERNAL = {"pip", "ray", "ruff", "mypy", "pytest", "wandb", "duckdb"}
#: pipeline commands that read a run's results: parsed only
PARSED = {"diff", "score", "report", "runs", "verify", "gc", "fetch", "export"}
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b")


def _blocks() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{page.relative_to(ROOT)}:{line}", m.group("lang"), m.group("body")))
    return out


BLOCKS = _blocks()


def _commands(body: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped,
    ``a && b`` split."""
    out: list[list[str]] = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1 :]
    return out


@pytest.fixture(scope="module")
def empty_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog no run has written to yet, with its views.sql."""
    from catalog.store import Catalog
    from catalog.views import write_views_sql

    root = tmp_path_factory.mktemp("catalog")
    (root / "runs").mkdir()
    write_views_sql(Catalog(str(root)))
    return root


def _pipeline(args: list[str], catalog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli.main import invoke

    if args[0] in ("run", "show") and ("--only" in args or "--from" in args):  # after a run: the spec is checked
        args = ["validate", *_without(args[1:], "--address", "--debug", "--only", "--from", "--catalog")]
    elif args[0] == "run":  # the same spec, overrides and selection, shown instead of run
        args = ["show", *_without(args[1:], "--address", "--debug")]
    if args[0] in ("run", "show", "query") or "--catalog" in args:
        args = _with_catalog(args, catalog if args[0] == "query" else None)
    if args[0] == "sweep":
        from pipelines.sweep.file import check, load_sweep

        overrides = [args[i + 1] for i, a in enumerate(args) if a in ("-o", "--override")]
        check(load_sweep(args[1], overrides))
        return
    if args[0] in PARSED or PLACEHOLDER.search(" ".join(args[1:])):
        _parsed(args)
        return
    code = invoke(args)
    captured = capsys.readouterr()
    assert code == 0, f"pipeline {shlex.join(args)} exited {code}: {captured.err.strip()}"


def _without(args: list[str], *flags: str) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = a != "--debug"
        else:
            out.append(a)
    return out


def _with_catalog(args: list[str], catalog: Path | None) -> list[str]:
    """`--catalog X` replaced by the empty catalog (a query), or dropped (what `show`
    would do on a catalog does not matter here)."""
    args = _without(args, "--catalog")
    return [*args, "--catalog", str(catalog)] if catalog is not None else args


def _parsed(args: list[str]) -> None:
    """The command line parses: the command exists, its options and arguments are right."""
    import typer

    from pipelines.cli.main import app

    group = typer.main.get_command(app)
    ctx = group.make_context("pipeline", list(args), resilient_parsing=False)
    name, command, rest = group.resolve_command(ctx, list(args))
    assert command is not None, args
    command.make_context(name, rest, parent=ctx)


class _Parsed(Exception):
    pass


def _script(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's arguments, parsed by its own parser; nothing after that runs."""
    original = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        original(self, *a, **k)  # a missing or wrong argument exits 2 here
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    monkeypatch.chdir(ROOT)
    if args[0] == "-m":
        monkeypatch.setattr(sys, "argv", [args[1], *args[2:]])
        monkeypatch.delitem(sys.modules, args[1], raising=False)  # run as __main__, not the imported copy
        run = lambda: runpy.run_module(args[1], run_name="__main__")  # noqa: E731
    else:
        assert (ROOT / args[0]).is_file(), f"{args[0]}: no such script"
        monkeypatch.setattr(sys, "argv", args)
        monkeypatch.syspath_prepend(str((ROOT / args[0]).parent))
        run = lambda: runpy.run_path(str(ROOT / args[0]), run_name="__main__")  # noqa: E731
    from envs import registry as env_registry
    from stages import registry as stage_registry

    kept = [env_registry._REGISTRY, env_registry._PREFIXES, stage_registry.BUILT_IN, stage_registry.IMPORTED]
    before = [dict(d) for d in kept]
    try:
        run()
    except _Parsed:
        return
    except SystemExit as exc:
        pytest.fail(f"python {shlex.join(args)}: exited {exc.code} while parsing its arguments")
    finally:  # a module run again as __main__ registers its copies: the next tests get the real ones
        for table, entries in zip(kept, before, strict=True):
            table.clear()
            table.update(entries)
    pytest.fail(f"python {shlex.join(args)}: never parsed its arguments")


def _spec(body: str, where: str, tmp_path: Path) -> None:
    import yaml

    from pipelines.graph.load import load_spec
    from pipelines.sweep.file import check, load_sweep

    data = yaml.safe_load(body)
    if "sweep" in data:
        path = tmp_path / "sweep.yaml"
        path.write_text(body)
        check(load_sweep(str(path)))
        return
    path = tmp_path / "example.yaml"
    if "pipeline" in data or "extends" in data:
        path.write_text(body)
    else:  # a fragment: over the default
        path.write_text("extends: starpo.yaml\n" + body)
    load_spec(str(path))


@pytest.mark.parametrize(("where", "lang", "body"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_example_runs_as_written(
    where: str,
    lang: str,
    body: str,
    empty_catalog: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import stages  # noqa: F401  (registers the stages)

    if lang in ("", "text", "mermaid"):  # output and figures, not input
        return
    if "openenv" in body.lower() and lang in ("yaml", "python"):  # docs/envs.md#openenv: our Sokoban, served
        from tests.fixtures.openenv_servers import ours

        with ours([("sokoban", {"num_boxes": 1})]) as (url,):
            body = re.sub(r"http://127\.0\.0\.1:\d+", url, body)
            if lang == "yaml":
                _spec(body, where, tmp_path)
            else:
                _python(body, empty_catalog, monkeypatch)
        return
    if lang == "yaml" and "env: verifiers" in body:  # docs/envs.md#verifiers: the fixture environment, as if installed
        monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
        from common.errors import SpecError

        try:
            import verifiers  # noqa: F401
        except ImportError:  # its own environment (bash .ci/verifiers): here the spec is right up to the package
            with pytest.raises(SpecError, match=r"needs the verifiers package"):
                _spec(body, where, tmp_path)
            return
        _spec(body, where, tmp_path)
        return
    if lang == "yaml":
        if "env: served" in body:  # the served environment: a server of our own, on any free port
            from envs.served import EnvServer

            server = EnvServer()
            server.start()
            body = re.sub(r"http://127\.0\.0\.1:\d+", server.url, body)
            try:
                _spec(body, where, tmp_path)
            finally:
                server.stop()
            return
        if "tasks.jsonl" in body:  # docs/envs.md's task records: the reader's own file, with the fields it names
            import json

            monkeypatch.chdir(tmp_path)
            tasks = [{"question": f"{n} + 1?", "solution": str(n + 1)} for n in range(4)]
            (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        _spec(body, where, tmp_path)
        return
    if lang == "sql":
        from catalog.query import query
        from catalog.store import Catalog

        for statement in (s.strip() for s in body.split(";")):
            lines = [ln for ln in statement.splitlines() if not ln.strip().startswith("--")]
            if lines:
                query(Catalog(str(empty_catalog)), "\n".join(lines))
        return
    if lang == "python":
        _python(body, empty_catalog, monkeypatch)
        return
    assert lang == "bash", f"{where}: a ```{lang} block; say here how to check it"
    with contextlib.ExitStack() as stack:
        served: list[str] = []
        if "--protocol openenv --env frozenlake" in body:  # docs/envs.md's OpenEnv preset: its server, on a free port
            from tests.fixtures.openenv_servers import ours

            (url,) = stack.enter_context(ours([("frozenlake", {"slippery": False, "render": "grid"})]))
            served = ["-o", f"rollout.env_options.url={url}", "-o", f"eval.env_options.openenv.url={url}"]
        for words in _commands(body):
            if words[0] in EXTERNAL:
                continue
            if words[0] == "pipeline":
                _pipeline([*words[1:], *(served if any("openenv" in w for w in words) else [])], empty_catalog, capsys)
            elif words[0] == "python":
                _script(words[1:], monkeypatch)
            else:
                pytest.fail(f"{where}: `{words[0]}`: say in tests/test_examples.py how to check this command")


def _python(body: str, catalog: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(catalog.parent)
    (catalog.parent / "pipeline-data").mkdir(exist_ok=True)
    (catalog.parent / "pipeline-data" / "views.sql").write_text((catalog / "views.sql").read_text())
    started: list[Any] = []
    if "Runner(" in body:  # it would train: the runner is built (the spec loaded, hooks given), not run
        from pipelines.run.runner import Runner

        monkeypatch.setattr(Runner, "run", lambda self, *a, **k: started.append(self))
    exec(compile(body, "<example>", "exec"), {"__name__": "__example__"})
    if "Runner(" in body:
        assert started and started[0].hooks, "the example's runner was never started with its hooks"


def test_the_checks_catch_a_broken_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each kind of check fails on a broken example (a test that cannot fail proves nothing)."""
    from common.errors import SpecError

    with pytest.raises(SpecError, match=r"rollout\.n_group"):
        _spec("rollout: {n_group: 8}\n", "x", tmp_path)
    with pytest.raises(AssertionError, match="exited 2"):
        _pipeline(["validate", "starpo.yaml", "-o", "update.lr=1"], tmp_path, capsys)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(pytest.fail.Exception, match="exited 2 while parsing"):
        _script(["experiments/seeds.py", "--no-such-flag"], patch)  # undone here: argparse is whole again
    assert _commands("pipeline run a.yaml \\\n  -o x=1 && pipeline query 'select 1' # note\n") == [
        ["pipeline", "run", "a.yaml", "-o", "x=1"],
        ["pipeline", "query", "select 1"],
    ]
