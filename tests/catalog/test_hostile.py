"""A catalog that was tampered with or damaged: its text never runs as SQL, damage is
repaired or named in one line, and nothing blocks the next run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from catalog.query import ask, query
from catalog.upkeep import verify
from catalog.views import connect
from common.errors import UserError
from pipelines.cli.main import app
from tests.conftest import TEST_PIPELINE, run_spec


@pytest.fixture
def filled(spec_file, catalog):
    path = spec_file(TEST_PIPELINE)
    run_spec(path, catalog)
    catalog.spec_path = path
    return catalog


def _key(catalog, prefix: str) -> str:
    return next(k for k in catalog.result_keys() if k.startswith(prefix))


def _manifest_path(catalog, key: str) -> Path:
    return Path(catalog.root.path("results", key, "manifest.json"))


def _edit_manifest(catalog, key: str, change) -> None:
    path = _manifest_path(catalog, key)
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


INJECTIONS = [
    # a view name that closes the statement and writes a file
    lambda m, target: m["outputs"]["numbers"].update(
        view=f"zz AS SELECT 1; COPY (SELECT 42) TO '{target}'; CREATE VIEW zz2"
    ),
    # a metrics value that is a string (once written with repr())
    lambda m, target: m["metrics"].update({"x": f"1); COPY (SELECT 42) TO '{target}'; --"}),
    # a run name carrying SQL into the results index
    lambda m, target: m.update(run=f"x'); COPY (SELECT 42) TO '{target}'; --"),
    # a seconds value that is not a number
    lambda m, target: m.update(seconds=f"1); COPY (SELECT 42) TO '{target}'; --"),
    # an input address with a path in it
    lambda m, target: m["inputs"].update(x=f"../../{target}"),
    # an output file outside the result
    lambda m, target: m["outputs"]["numbers"].update(files=["../../../etc/passwd"]),
]


@pytest.mark.parametrize("inject", INJECTIONS)
def test_manifest_text_never_runs_as_sql(filled, tmp_path, inject):
    target = tmp_path / "pwned.csv"
    key = _key(filled, "t_source")
    _edit_manifest(filled, key, lambda m: inject(m, target))
    answer = ask(filled, "select 1 as one")
    assert answer.table.to_pylist() == [{"one": 1}] and not target.exists()
    assert any(key in n and "manifest.json" in n for n in answer.notes)
    # the plain duckdb client's views.sql is built the same way
    run_spec(filled.spec_path, filled)
    con = duckdb.connect()
    con.execute(Path(filled.root.path("views.sql")).read_text())
    assert not target.exists()
    for cmd in (["runs"], ["query", "select 1"], ["verify"]):
        result = _invoke(*cmd, "--catalog", filled.root.uri)
        assert "Traceback" not in result.output and not target.exists()


def test_a_manifest_edited_without_its_digest_is_damaged_on_every_read(filled):
    """A same-size flipped digit in a metric, or a ``files`` key made unreadable: the
    run's own read finds it (its digest), not only `pipeline verify`."""
    from catalog.manifests import ManifestError

    key = _key(filled, "t_scale")
    path = _manifest_path(filled, key)
    text = path.read_text()
    at = text.index('"adv/total": ') + len('"adv/total": ')
    flipped = text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1 :]  # the metric's first digit
    assert flipped != text and len(flipped) == len(text) and json.loads(flipped)["metrics"]["adv/total"] is not None
    path.write_text(flipped)
    with pytest.raises(ManifestError, match="digest does not match"):
        filled.manifest(key)
    again, display = run_spec(filled.spec_path, filled)
    assert again.ran >= 1 and any(key in w and "digest" in w and "computing it again" in w for w in display.warnings)
    other = _key(filled, "t_source")
    _edit_manifest(filled, other, lambda m: m.update({"fil3s": m.pop("files")}))
    with pytest.raises(ManifestError, match="lists no size and SHA-256"):
        m = json.loads(_manifest_path(filled, other).read_text())
        m["digest"] = __import__("catalog.manifests").manifests.digest(m)  # even with a digest made to fit
        _manifest_path(filled, other).write_text(json.dumps(m))
        filled.manifest(other)
    third = _key(filled, "t_state")
    _edit_manifest(filled, third, lambda m: m.update({"digast": m.pop("digest")}))  # its own key damaged
    with pytest.raises(ManifestError, match="has no digest"):
        filled.manifest(third)


def test_verify_names_a_tampered_manifest_and_the_next_run_repairs_it(filled):
    from catalog.manifests import digest

    key = _key(filled, "t_scale")

    def tamper(m: dict) -> None:  # well-formed, its digest made to fit, but not what the runs recorded
        m["metrics"].update({"adv/total": 1e9})
        m["digest"] = digest(m)

    _edit_manifest(filled, key, tamper)
    problems = verify(filled)
    assert [k for k, _ in problems] == [key] and "recorded" in problems[0][1]
    result = _invoke("verify", "--catalog", filled.root.uri)
    assert result.exit_code == 1 and f"result {key}: manifest.json differs" in result.stderr
    assert query(filled, "select count(*) from results where key = " + repr(key)).column(0).to_pylist() == [0]
    again, display = run_spec(filled.spec_path, filled)
    assert again.ran >= 1 and any(key in w and "computing it again" in w for w in display.warnings)
    assert verify(filled) == []


def test_a_flipped_byte_is_recomputed_once_verify_has_named_it(filled):
    key = _key(filled, "t_source")
    part = next(Path(filled.root.path("results", key)).glob("*/*.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    cached, _ = run_spec(filled.spec_path, filled)
    assert cached.ran == 0  # the run's cheap check (sizes) does not read every byte
    assert [k for k, _ in verify(filled)] == [key]
    again, display = run_spec(filled.spec_path, filled)
    assert again.ran >= 1 and any(key in w and "pipeline verify" in w for w in display.warnings)
    assert verify(filled) == []


@pytest.mark.parametrize("damage", ["truncated", "empty", "not-an-object", "missing"])
def test_a_result_without_a_readable_manifest_is_treated_as_absent(filled, damage):
    key = _key(filled, "t_scale")
    path = _manifest_path(filled, key)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "not-an-object":
        path.write_text("[1, 2]")
    else:
        path.unlink()
    for cmd in (["verify"], ["gc"], ["runs"], ["query", "select count(*) n from results"]):
        result = _invoke(*cmd, "--catalog", filled.root.uri)
        assert "Traceback" not in result.output, (cmd, result.output)
        assert key in result.output, (cmd, result.output)
    again, _ = run_spec(filled.spec_path, filled)
    assert again.ran >= 1 and filled.manifest(key)["key"] == key
    assert verify(filled) == []


def test_one_damaged_parquet_file_fails_only_the_views_that_read_it(filled):
    key = _key(filled, "t_source")
    part = next(Path(filled.root.path("results", key)).glob("*/*.parquet"))
    part.write_bytes(part.read_bytes()[:30])
    notes: list[str] = []
    con = connect(filled, notes)
    assert con.sql("select 1").fetchall() == [(1,)]
    assert con.sql("select count(*) from runs").fetchall() == [(1,)]
    assert any(part.name in n and "t_numbers" in n for n in notes)
    with pytest.raises(UserError, match=r"view t_numbers is unavailable: .*part-00000\.parquet"):
        query(filled, "select * from t_numbers")
    result = _invoke("query", "select * from t_numbers", "--catalog", filled.root.uri)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) >= 1 and "Traceback" not in result.output


def test_the_sandbox_is_the_catalog_alone(filled, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text("a\n1\n")
    for sql in ("select * from read_csv('.tmp/secret.csv')", f"select * from read_csv('{tmp_path}/.tmp/secret.csv')"):
        with pytest.raises(UserError, match="refused"):
            query(filled, sql)
    assert query(filled, "select current_setting('temp_directory') t").column(0).to_pylist() == [""]


def test_queries_are_limited_and_can_time_out(filled):
    answer = ask(filled, "select * from range(200000)", limit=5)
    assert answer.table.num_rows == 5 and answer.total == 200000 and answer.hidden == 199995
    with pytest.raises(UserError, match=r"stopped after 0\.2 s"):
        ask(filled, "select count(*) from range(10000000000) a", timeout=0.2)
    table = _invoke("query", "select * from range(1000)", "--catalog", filled.root.uri)
    assert table.exit_code == 0 and "(1000 rows; the last 900 not shown: --limit)" in table.stdout
    few = _invoke("query", "select * from range(1000)", "--limit", "3", "--catalog", filled.root.uri)
    assert "the last 997 not shown" in few.stdout
    slow = _invoke("query", "select count(*) from range(10000000000)", "--timeout", "0.2", "--catalog", filled.root.uri)
    assert slow.exit_code == 2 and "stopped after 0.2 s" in slow.stderr


def test_csv_encodes_lists_and_maps_as_json(filled):
    sql = "select [1, 2] as l, map {'a': 1} as m, {'x': 'y'} as s, 'plain' as t"
    result = _invoke("query", sql, "--format", "csv", "--catalog", filled.root.uri)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0] == '"l","m","s","t"' and lines[1].startswith('"[1, 2]"') and '"plain"' in lines[1]


def test_control_characters_never_reach_the_terminal(filled):
    result = _invoke("query", "select 'a' || chr(27) || '[2J' || chr(10) || 'b' as x", "--catalog", filled.root.uri)
    assert result.exit_code == 0 and "\x1b" not in result.output and "\\u001b[2J\\nb" in result.stdout
    bad = _invoke("query", "select \x1b[31m", "--catalog", filled.root.uri)
    assert bad.exit_code == 2 and "\x1b" not in bad.output


def test_non_utf8_sql_is_one_line(filled):
    result = _invoke("query", "select '\udcff'", "--catalog", filled.root.uri)
    assert result.exit_code == 2 and "not UTF-8" in result.stderr and "Traceback" not in result.output


def test_a_catalog_root_that_is_a_file(tmp_path, spec_file):
    root = tmp_path / "file"
    root.write_text("x")
    for cmd in (["runs"], ["query", "select 1"], ["verify"], ["gc"], ["run", spec_file(TEST_PIPELINE)]):
        result = _invoke(*cmd, "--catalog", str(root))
        assert result.exit_code == 2 and "is a file, not a folder" in result.stderr, (cmd, result.output)


def _drop_dac_override() -> None:
    """In a child process of root (how CI runs), before it executes the command: take
    the capabilities that let root write through permissions (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) out of its bounding set, so that the program it executes does
    not get them back and a folder's mode holds for it as for any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_catalog_is_one_line(tmp_path, spec_file):
    """Also as root (how CI runs): the command runs without root's power to write
    through a folder's permissions."""
    import subprocess
    import sys

    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    exe = Path(sys.executable).parent / "pipeline"
    try:
        done = subprocess.run(
            [str(exe), "run", spec_file(TEST_PIPELINE), "--catalog", str(root), "--import", "tests.conftest"],
            cwd=Path(__file__).resolve().parents[2],  # where `tests` imports from (its stages are the spec's)
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_drop_dac_override if os.geteuid() == 0 else None,
        )
        assert done.returncode == 2 and "cannot write there" in done.stderr and "Traceback" not in done.stderr, (
            done.stderr
        )
        assert done.stderr.count("\n") == 1
    finally:
        root.chmod(0o700)


def test_a_catalog_that_cannot_be_written_is_one_line(tmp_path, spec_file, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_bytes", refuse)
    result = _invoke("run", spec_file(TEST_PIPELINE), "--catalog", str(tmp_path / "ro"))
    assert result.exit_code == 2 and "cannot write there (Permission denied)" in result.stderr
    assert "Traceback" not in result.output


def test_a_catalog_that_turns_read_only_mid_run_drops_staging_and_lease(tmp_path, spec_file, monkeypatch):
    from catalog.store import ResultWriter

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self.staging))

    monkeypatch.setattr(ResultWriter, "commit", refuse)
    root = tmp_path / "cat"
    result = _invoke("run", spec_file(TEST_PIPELINE), "--catalog", str(root))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1 and "Traceback" not in result.output
    assert [p.name for p in (root / "_staging").iterdir()] == [] and list((root / "_leases").iterdir()) == []
