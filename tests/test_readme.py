"""The front door: the README stays short, its figures are what their commands printed,
and every link and script the docs name exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md", ROOT / "experiments" / "README.md"]
FIGURES = re.compile(r"<!-- figures: (\S+) -->(.*?)<!-- /figures -->", re.S)
NUMBER = re.compile(r"(?<![\w.])[+-]?\d+\.\d+(?![\w.])")


def numbers(text: str) -> set[float]:
    return {abs(float(x)) for x in NUMBER.findall(text)}


def test_the_readme_is_short_and_opens_with_the_quick_start():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"
    assert any(line == "## Quick start" for line in lines[:30]), "the quick start must be on the first screen"


def test_every_readme_figure_is_what_its_command_printed():
    assert len(FIGURES.findall(README.read_text())) >= 2, "the headline figures must name their result file"
    for page in [README, *DOCS]:  # docs/real-models.md's claims table is checked the same way
        text = page.read_text()
        for path, block in FIGURES.findall(text):
            record = json.loads((ROOT / path).read_text())
            assert record["commit"] and record["command"].startswith("python "), path
            script = record["command"].split()[1]
            assert (ROOT / script).is_file(), f"{path}: its command names {script}, which does not exist"
            assert script in text, f"{page.name} must name the command of {path} ({script})"
            quoted, printed = numbers(block), numbers("\n".join(record["printed"]))
            assert quoted, f"{page.name}: no figure between the markers of {path}"
            stale = sorted(quoted - printed)
            assert not stale, f"{page.name} figures {stale} are not in what `{record['command']}` printed ({path})"


def test_a_stale_figure_fails_the_check():
    """The check above must be able to fail: a figure changed by 0.1 is caught."""
    printed = numbers("| 90 | 77.0% | 69.1% | 62.5% | 69.5% | [51.6, 87.5] |")
    assert numbers("| after RL (v90) | **77.0%** | 69.1% |") <= printed
    assert not numbers("| after RL (v90) | **77.1%** |") <= printed


def test_relative_links_and_named_scripts_exist():
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    script = re.compile(r"\b((?:bench|experiments)/[a-z_]+\.py)\b")
    for page in [README, *DOCS]:
        text = page.read_text()
        for target in link.findall(text):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: link to {target}, which does not exist"
        for name in script.findall(text):
            assert (ROOT / name).is_file(), f"{page.relative_to(ROOT)} names {name}, which does not exist"


def _headings(text: str) -> set[str]:
    """The anchors a Markdown page's headings get (GitHub's rule: lower case, punctuation
    dropped, spaces to hyphens, -1, -2, ... on repeats), code blocks left out."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _broken_anchors(page: Path, text: str) -> list[str]:
    broken = []
    anchors = {"": _headings(text)}  # each linked page read and parsed once
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
        if "://" in target:
            continue
        if target not in anchors:
            anchors[target] = _headings((page.parent / target).read_text())
        if anchor not in anchors[target]:
            broken.append(f"{target}#{anchor}")
    return broken


def test_every_link_to_a_section_finds_its_heading():
    for page in [README, *DOCS]:
        broken = _broken_anchors(page, page.read_text())
        assert not broken, f"{page.relative_to(ROOT)}: links to sections that no heading makes: {broken}"


def test_a_renamed_heading_fails_the_section_check():
    """The check above must be able to fail: a link to a heading that changed is caught."""
    page = ROOT / "docs" / "results.md"
    assert not _broken_anchors(page, "## Reading the holes\n\n[it](#reading-the-holes), [results](method.md#glossary)")
    assert _broken_anchors(page, "## Reading the holes, again\n\n[it](#reading-the-holes)") == ["#reading-the-holes"]
    assert _broken_anchors(page, "[it](method.md#no-such-section)") == ["method.md#no-such-section"]


def test_every_script_is_in_its_folders_index():
    for folder in ("bench", "experiments"):
        index = (ROOT / folder / "README.md").read_text()
        for path in sorted((ROOT / folder).glob("*.py")):
            assert f"`{path.name}`" in index, f"{folder}/{path.name} is missing from {folder}/README.md"
