"""JSON Lines, read as the format defines them: one JSON value per line, lines ended by
``\\n`` only. `str.splitlines` also splits at U+2028, U+2029, U+0085 and other
characters that JSON text may hold unescaped (our own export writes them as they are),
so a transcript holding one would not read back."""

from __future__ import annotations


def lines(text: str) -> list[str]:
    """The lines of JSON Lines `text` (a trailing ``\\r`` of a CRLF file dropped)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
