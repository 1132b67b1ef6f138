"""What a new user meets in their second hour: help that reads as a command line,
`explain` of every key a spec accepts, tables that fit the terminal, `report` naming
only what it wrote, run names in any script, and an override's mistake blamed on the
override."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from pipelines.cli.main import app
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO

COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]


def invoke(*args: str, columns: int = 80):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)}, prog_name="pipeline")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_a_command_line_not_python_types(command):
    got = invoke(command, "--help")
    assert got.exit_code == 0, got.output
    text = got.output
    assert not re.search(r"<(str|bool|int|float|list\[.*?\]|path)>", text), text
    assert "{" not in text.splitlines()[0], text.splitlines()[0]
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)
    if "--override" in text:
        assert "-o, --override KEY=VALUE" in text
    if "--debug" in text:
        assert re.search(r"^\s*--debug\s{2,}", text, re.M)


def test_usage_lines_name_arguments_as_a_command_line_writes_them():
    assert invoke("run", "--help").output.startswith("Usage: pipeline run [OPTIONS] SPEC\n")
    assert invoke("explain", "--help").output.startswith("Usage: pipeline explain [OPTIONS] SPEC [KEY]\n")
    assert "Usage: pipeline report [OPTIONS] [RUNS...]" in invoke("report", "--help").output


def test_every_key_the_spec_accepts_is_explained():
    from pipelines.graph.load import load_spec

    spec = load_spec("starpo.yaml")
    keys = sorted({*spec.resolved} | {"agent", "agent.max_turns", "pipeline", "pipeline.eval", "pipeline.eval.every"})
    for key in keys:
        got = invoke("explain", "starpo.yaml", key)
        assert got.exit_code == 0 and got.output.strip(), f"explain {key}: {got.output}"
    shared = invoke("explain", "starpo.yaml", "agent").output  # the section as written, once (every stage agrees)
    assert shared.startswith("agent.max_turns = 5") and "eval.agent.max_turns" not in shared
    assert "pipeline.eval.every = 30" in invoke("explain", "starpo.yaml", "pipeline").output


NAME = "expérience-of-a-rather-long-name"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory):
    """A catalog holding one small run, named in French."""
    from catalog.store import Catalog

    folder = tmp_path_factory.mktemp("ran")
    (folder / "spec.yaml").write_text(TINY_GRPO.replace("run: {", f"run: {{name: {NAME}, "))
    run_spec(str(folder / "spec.yaml"), Catalog(str(folder / "catalog")))
    return folder


def test_tables_fit_the_terminal(ran):
    for columns in (60, 80, 120):
        for args in (("runs",), ("query", "select * from runs"), ("query", "select * from steps")):
            got = invoke(*args, "--catalog", str(ran / "catalog"), columns=columns)
            assert got.exit_code == 0, got.output
            widest = max(len(line) for line in got.output.splitlines())
            assert widest <= columns, f"{args} at {columns} columns: {widest}"
            assert "…" not in got.output, "a value folds onto the next line, never cut"


def test_report_names_only_what_it_wrote(ran, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = invoke("report", NAME, "--catalog", str(ran / "catalog"))
    assert got.exit_code == 0, got.output
    for path in re.findall(r"(reports/\S+?)[)/]?(?:\s|$)", got.output):
        assert (tmp_path / path.rstrip("/")).exists(), f"{path} named but not written: {got.output}"


@pytest.mark.parametrize("name", ["expérience", "実験-1", "Ωmega_2"])
def test_a_run_name_in_any_script_is_taken_as_it_is(name):
    got = invoke("validate", "starpo.yaml", "-o", f"run.name={name}")
    assert got.exit_code == 0, got.output


def test_a_run_named_in_any_script_runs_and_is_listed_as_it_is(ran):
    listed = invoke("runs", "--catalog", str(ran / "catalog"), columns=200)
    assert NAME in listed.output and "\\u" not in listed.output


@pytest.mark.parametrize("name", ["a b", "../x", ".hidden", "e\u0301t\u0301e\u0301"])
def test_a_run_name_that_is_not_one_says_exactly_what_is_allowed(name):
    got = invoke("validate", "starpo.yaml", "-o", f"run.name={name}")
    assert got.exit_code == 2
    assert "letters and digits of any script, '_', '.' or '-'" in got.output and "\\u" not in got.output


def test_a_mistake_an_override_caused_is_blamed_on_the_override():
    got = invoke("validate", "starpo.yaml", "-o", "pipeline.rollout.every=2")
    assert got.exit_code == 2
    assert got.output.startswith("error: -o pipeline.rollout.every=2: "), got.output
