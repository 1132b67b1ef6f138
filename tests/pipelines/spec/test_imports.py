"""A user's own stages from the command line: the spec's ``imports:``, ``--import``,
and installed packages' entry points, typed as a user types them (a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from common.errors import UserError
from pipelines.spec import imports

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "tests" / "fixtures" / "demo.yaml"

#: a stage module of a user's project, and a spec that uses it
MODULE = '''
from dataclasses import dataclass

import pyarrow as pa

from catalog.datasets import Table
from stages.registry import StageResult, stage


@dataclass(frozen=True)
class Config:
    n: int = 3


@stage("mine.count", config=Config, outputs={"rows": Table(view="mine_rows")})
def count(ctx, cfg):
    """Rows 0..n-1."""
    return StageResult(tables={"rows": pa.table({"i": list(range(cfg.n))})})
'''
SPEC = "run: {iterations: 1}\npipeline:\n  count: {stage: mine.count}\n"


def pipeline(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cli = "from pipelines.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", cli, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_demo_runs_from_the_cli_with_its_declared_import(tmp_path):
    done = pipeline("run", str(DEMO), "--catalog", str(tmp_path / "catalog"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("run demo: 41 stages ran, 0 cached")


def test_import_option_and_spec_imports_find_a_users_module(tmp_path):
    (tmp_path / "my_stages.py").write_text(MODULE)
    (tmp_path / "plain.yaml").write_text(SPEC)
    done = pipeline("validate", "plain.yaml", "--import", "my_stages", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("ok:"), done.stderr
    missing = pipeline("validate", "plain.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and "unknown stage 'mine.count'" in missing.stderr
    # declared in the spec and found beside it, whatever the working directory
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "my_stages.py").write_text(MODULE)
    (tmp_path / "specs" / "declared.yaml").write_text("imports: [my_stages]\n" + SPEC)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = pipeline("run", str(tmp_path / "specs" / "declared.yaml"), "--catalog", str(tmp_path / "c"), cwd=elsewhere)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("imports: [no_such_module]\n", r"cannot import module 'no_such_module' \(ModuleNotFoundError"),
        ("imports: [broken]\n", r"cannot import module 'broken' \(ZeroDivisionError: division by zero\)"),
        ("imports: my_stages\n", r"imports: expected a list of module names"),
        ("imports: ['../etc']\n", r"'../etc' is not a module name"),
    ],
)
def test_an_import_that_fails_is_one_line_naming_the_module(tmp_path, body, why):
    import re

    (tmp_path / "broken.py").write_text("1 / 0\n")
    (tmp_path / "bad.yaml").write_text(body + SPEC)
    done = pipeline("validate", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert re.search(why, done.stderr), done.stderr


def test_installed_packages_register_through_entry_points(tmp_path, monkeypatch):
    (tmp_path / "pkg_stages.py").write_text(MODULE.replace("mine.count", "pkg.count"))
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [EntryPoint("pkg", "pkg_stages", imports.GROUP)]
    monkeypatch.setattr(imports, "entry_points", lambda group: found if group == imports.GROUP else [])
    imports.load_entry_points.cache_clear()
    try:
        assert imports.load_entry_points() == ("pkg_stages",)
        from stages.registry import STAGES

        assert "pkg.count" in STAGES
        found[:] = [EntryPoint("bad", "no_such_pkg_stages", imports.GROUP)]
        imports.load_entry_points.cache_clear()
        with pytest.raises(
            UserError, match=r"entry point 'bad' \(no_such_pkg_stages\) of group starpo_pipeline.stages"
        ):
            imports.load_entry_points()
    finally:
        imports.load_entry_points.cache_clear()
        from stages.registry import IMPORTED

        IMPORTED.pop("pkg.count", None)
        sys.modules.pop("pkg_stages", None)
