"""The pages read in minutes: the rules of CONTRIBUTING.md, measured by
experiments/docstyle.py. The history page (docs/history.md) is exempt: it keeps the
investigations as they were written."""

from __future__ import annotations

import pytest

from experiments.docstyle import CELL, EXEMPT, LONG, ROOT, measure, pages, sentences, units

#: the most words the README may have (`wc -w`: code, tables and markers count)
README_WORDS = 1500
#: the share of a page's words that may sit in sentences over `LONG` words
LONG_SHARE = 0.10
PAGES = [p for p in pages() if str(p.relative_to(ROOT)) not in EXEMPT]


def test_the_readme_reads_in_five_minutes():
    readme = ROOT / "README.md"
    words = len(readme.read_text().split())
    assert words <= README_WORDS, f"README.md has {words} words; at most {README_WORDS}: move detail to docs/"
    style = measure(readme)
    assert style.longest <= LONG, f"README.md: a sentence of {style.longest} words: {style.longest_text}"
    assert not style.hashes, f"README.md names commits {style.hashes}: provenance lives in the records"
    assert not style.wide_cells, f"README.md: cells over {CELL} characters: {style.wide_cells}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_page_keeps_its_sentences_short(page):
    style = measure(page)
    assert style.long_share <= LONG_SHARE, (
        f"{style.page}: {100 * style.long_share:.1f}% of its words are in sentences over {LONG} words "
        f"(at most {100 * LONG_SHARE:.0f}%); the longest: {style.longest_text}"
    )
    assert not style.wide_cells, f"{style.page}: cells over {CELL} characters: {style.wide_cells[:3]}"
    assert not style.hashes, f"{style.page}: commit hashes in prose {style.hashes}: put them in a footer"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_page_opens_with_what_it_answers_and_for_whom(page):
    if page.name == "README.md":
        return
    prose, _ = units(page.read_text())
    first = sentences(prose[0])[0]
    assert first.startswith("This page is for "), f"{page.name} opens with {first!r}; say whom it is for"


def test_the_rules_catch_what_they_forbid(tmp_path, monkeypatch):
    """The adversary: a long sentence, a wide cell and a hash in prose are caught; a hash in
    a provenance footer, a code block or a table is not."""
    import experiments.docstyle as docstyle

    monkeypatch.setattr(docstyle, "ROOT", tmp_path)
    long = "Word " + " ".join(["word"] * LONG) + "."
    page = tmp_path / "p.md"
    page.write_text(
        f"# T\n\nShort one. {long} Another.\n\n| {'x' * (CELL + 1)} | a1b2c3d |\n|---|---|\n\n"
        "Fixed at 9f5a06a here.\n\n```bash\ngit show 1234abc\n```\n\n<sub>Record: r (a3e242d)</sub>\n"
    )
    style = measure(page)
    assert style.long_words == LONG + 1 and style.longest == LONG + 1
    assert len(style.wide_cells) == 1
    assert style.hashes == ["9f5a06a"]
    page.write_text("# T\n\nA sentence. Another short one, e.g. this: fine.\n")
    assert measure(page).long_words == 0
