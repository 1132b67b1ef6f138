"""How the README and docs/ read: words, reading time, the share of words in long
sentences, the longest sentence, table cells over the limit and commit hashes in prose.
`tests/test_docs_style.py` holds the limits (CONTRIBUTING.md states them); this script
prints the table a reviewer compares against.

    python experiments/docstyle.py            # every page
    python experiments/docstyle.py README.md  # one page
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from common.pages import ROOT, pages

#: a long sentence, in words (CONTRIBUTING.md)
LONG = 40
#: the widest table cell, in characters
CELL = 200
#: pages outside the reading path: the dated history keeps its notebook prose
EXEMPT = {"docs/history.md"}
_FENCE = re.compile(r"^(```|~~~)")
_LIST = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_END = re.compile(r"(?<=[.!?])[)\"*]*\s+(?=[A-Z0-9`(*\[\"])")
#: a commit hash: 7-40 hex digits with at least one letter and one digit
_HASH = re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])")
_FOOTER = re.compile(r"^<sub>")


@dataclass
class Style:
    """What one page's prose measures."""

    page: str
    words: int
    long_words: int
    longest: int
    longest_text: str
    wide_cells: list[str]
    hashes: list[str]

    @property
    def long_share(self) -> float:
        return self.long_words / self.words if self.words else 0.0


def units(text: str) -> tuple[list[str], list[str]]:
    """The page's prose, as paragraphs and list items (code, tables, headings and markers
    left out), and its table cells."""
    prose: list[str] = []
    cells: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            prose.append(" ".join(current))
            current.clear()

    for raw in _COMMENT.sub("", text).splitlines():
        line = raw.rstrip()
        if _FENCE.match(line.strip()):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            close()
            continue
        if stripped.startswith("|"):
            close()
            cells += [c.strip() for c in stripped.strip("|").split("|")]
            continue
        if _LIST.match(line) or stripped.startswith(">"):
            close()
            stripped = _LIST.sub("", stripped.lstrip("> "))
        current.append(stripped)
    close()
    return prose, cells


def sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences: split after `.`, `!` or `?` before a capital, a digit or markup."""
    plain = _LINK.sub(r"\1", paragraph)
    return [s for s in _END.split(plain) if s.strip()]


def measure(path: Path) -> Style:
    text = path.read_text()
    prose, cells = units(text)
    words = long_words = longest = 0
    longest_text = ""
    hashes: list[str] = []
    for paragraph in prose:
        if not _FOOTER.match(paragraph):
            hashes += _HASH.findall(_LINK.sub(r"\1", re.sub(r"`[^`]*`", "", paragraph)))
        for sentence in sentences(paragraph):
            n = len(sentence.split())
            words += n
            if n > LONG:
                long_words += n
            if n > longest:
                longest, longest_text = n, sentence
    wide = [c for c in cells if len(c) > CELL]
    return Style(str(path.relative_to(ROOT)), words, long_words, longest, longest_text, wide, hashes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="pages to measure (default: the README and docs/)")
    parser.add_argument("--long", action="store_true", help="also list each page's sentences over the limit")
    args = parser.parse_args()
    chosen = [ROOT / p for p in args.pages] or pages()
    missing = [str(p) for p in chosen if not p.is_file()]
    if missing:
        print(f"error: no such page: {', '.join(missing)} (expected a path from the repository root)", file=sys.stderr)
        sys.exit(2)
    print(f"| page | words | reading (min) | in sentences > {LONG} words | longest | cells > {CELL} chars | hashes |")
    print("|---|---|---|---|---|---|---|")
    total = 0
    for path in chosen:
        s = measure(path)
        words = len(path.read_text().split())
        total += words
        print(
            f"| {s.page} | {words:,} | {words / 240:.1f} | {100 * s.long_share:.1f}% | {s.longest} "
            f"| {len(s.wide_cells)} | {len(s.hashes)} |"
        )
    print(f"all pages: {total:,} words ({total / 240:.0f} min at 240 words a minute)")
    if args.long:
        for path in chosen:
            prose, _ = units(path.read_text())
            for paragraph in prose:
                for sentence in sentences(paragraph):
                    if len(sentence.split()) > LONG:
                        print(f"\n{path.relative_to(ROOT)} ({len(sentence.split())}): {sentence}")


if __name__ == "__main__":
    sys.exit(main())
