"""experiments/render.py: every rendered table is its record's, digit for digit, and every
record carries a command a reader can run and its provenance."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from experiments import render
from experiments.render import PROVENANCE, RECORDS, ROOT, RenderError, check, render_block

RECORD_FILES = sorted(RECORDS.glob("*.json"))


def test_every_page_is_its_render():
    stale = check()
    assert not stale, f"{stale} differ from their records: run python experiments/render.py"


def test_the_pages_render_tables():
    blocks = [m for p in render.pages() for m in render.BLOCK.finditer(p.read_text())]
    assert len(blocks) >= 20
    assert any("paired" in m.group(2) for m in blocks) and any("columns" in m.group(2) for m in blocks)


def test_a_tampered_figure_fails_the_check(tmp_path, monkeypatch):
    """The adversary: one digit changed in a rendered table, or a record changed under a
    page, and the page is no longer its render."""
    page = ROOT / "docs" / "results.md"
    text = page.read_text()
    assert "| 90 | 80.5% |" in text
    copy = tmp_path / "docs" / "results.md"
    copy.parent.mkdir()
    copy.write_text(text.replace("| 90 | 80.5% |", "| 90 | 80.6% |", 1))
    monkeypatch.setattr(render, "pages", lambda: [copy])
    monkeypatch.setattr(render, "ROOT", tmp_path)
    assert check() == ["docs/results.md"]
    records = tmp_path / "results"
    records.mkdir()
    for path in RECORDS.glob("*.json"):
        (records / path.name).write_text(path.read_text())
    record = json.loads((records / "seeds-starpo.json").read_text())
    record["printed"] = [line.replace("80.5%", "80.4%") for line in record["printed"]]
    (records / "seeds-starpo.json").write_text(json.dumps(record))
    monkeypatch.setattr(render, "RECORDS", records)
    copy.write_text(text)
    assert check() == ["docs/results.md"]


def test_the_paired_table_recomputes_the_published_differences():
    """The filter's paired difference is computed from the records' per-seed rates, not copied."""
    out = render_block("paired seeds-starpo filter-none-6b18a34", ROOT / "docs" / "x.md")
    assert "| filter-none-6b18a34 | 78.1% | 89.8% | 81.6% | 83.2% | [61.6, 94.4] | +0.5 [-6.3, +7.3] |" in out


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-record", "cannot be read"),
        ("../../README", "expected a file name"),
        ("bench/../README", "expected a file name"),
        ("bench/no-such-record", "bench/results/no-such-record.json cannot be read"),
        ("seeds-starpo table=9", "printed 1 table"),
        ("seeds-starpo rows=0,77", "rows ['77']"),
        ("paired seeds-starpo comparators-grid", "not a seeds table"),
    ],
)
def test_a_bad_marker_is_one_clear_error(spec, message):
    with pytest.raises(RenderError, match=message.replace("[", r"\[").replace("]", r"\]")):
        render_block(spec, ROOT / "docs" / "x.md")


@pytest.mark.parametrize("path", RECORD_FILES, ids=[p.stem for p in RECORD_FILES])
def test_every_record_is_portable_and_carries_its_provenance(path: Path):
    record = json.loads(path.read_text())
    missing = [k for k in PROVENANCE if k not in record]
    assert not missing, f"{path.name}: no {missing}"
    words = shlex.split(record["command"])
    assert words[0] == "python" and (ROOT / words[1]).is_file(), record["command"]
    machine_paths = [w for w in words if w.startswith(("/", "~")) or "/tmp/" in w or "/work/" in w]
    assert not machine_paths, f"{path.name}: its command names paths of the machine that ran it: {machine_paths}"
    assert record["status"] in ("current", "superseded"), record["status"]
    if record["status"] == "superseded":
        successor = RECORDS / f"{record['superseded_by']}.json"
        assert successor.is_file(), f"{path.name}: superseded by {record['superseded_by']}, which does not exist"
        assert json.loads(successor.read_text())["status"] == "current"
    else:
        assert record["superseded_by"] is None
    assert isinstance(record["caveats"], list) and record["machine"]


def test_a_rendered_record_is_current():
    """A page shows current results; a superseded record belongs to the history."""
    shown = {
        name
        for p in render.pages()
        if p.name != "history.md"
        for m in render.BLOCK.finditer(p.read_text())
        for name in shlex.split(m.group(2))
        if "=" not in name and name not in ("paired", "columns")
    }
    stale = [n for n in sorted(shown) if json.loads(render.record_path(n).read_text())["status"] != "current"]
    assert not stale, f"pages render superseded records: {stale}"


def test_a_bad_marker_from_the_command_line_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    page = tmp_path / "p.md"
    page.write_text("<!-- render: no-such-record -->\n<!-- /render -->\n")
    monkeypatch.setattr(render, "pages", lambda: [page])
    monkeypatch.setattr("sys.argv", ["render.py", "--check"])
    with pytest.raises(SystemExit) as exit_:
        render.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: record no-such-record")


def test_a_row_left_out_by_name_and_a_misspelt_option_are_said(tmp_path):
    """`without=all` leaves the pooled row of a paired table out (its p would treat shared
    rooms as independent); an option a form does not take fails instead of being ignored."""
    import pytest

    from experiments.render import RenderError, render_block

    text = render_block("paired-gemma3-sokoban without=all", tmp_path / "p.md")
    assert "| all |" not in text and "(seed 2)" in text
    with pytest.raises(RenderError, match="not \\['withot'\\]"):
        render_block("paired-gemma3-sokoban withot=all", tmp_path / "p.md")
    with pytest.raises(RenderError, match="rows \\['none'\\] are not in its table"):
        render_block("paired-gemma3-sokoban without=none", tmp_path / "p.md")
