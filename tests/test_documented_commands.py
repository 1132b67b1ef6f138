"""Every command the README and docs quote runs as written, as far as its command line
goes: a script of experiments/ or bench/ gets every argument it requires and only
options it has; a `pipeline` command names a command that exists, with options it has."""

from __future__ import annotations

import ast
import re
import shlex
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md"]
_SCRIPT = re.compile(r"`(python (?:experiments|bench)/[a-z_]+\.py(?: [^`]*)?)`")
_PIPELINE = re.compile(r"`(pipeline [a-z]+(?: [^`]*)?)`")


def _quoted(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [(page.name, m.group(1)) for m in pattern.finditer(text.replace("\n", " "))]
    return found


@cache
def _arguments(script: Path) -> tuple[set[str], set[str], int]:
    """The script's options, its required options, and its required positional arguments
    (read from its `add_argument` calls, without running it)."""
    options, required, positional = set(), set(), 0
    for node in ast.walk(ast.parse(script.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        keywords = {k.arg: k.value for k in node.keywords}
        if names and names[0].startswith("-"):
            options.update(names)
            flag = keywords.get("required")
            if isinstance(flag, ast.Constant) and flag.value is True:
                required.add(names[-1])
        elif names:
            nargs = keywords.get("nargs")
            if not (isinstance(nargs, ast.Constant) and nargs.value in ("?", "*")):
                positional += 1
    return options, required, positional


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def test_every_quoted_script_gets_what_it_requires():
    commands = _quoted(_SCRIPT)
    assert len(commands) > 20
    wrong = []
    for page, command in commands:
        words = _words(command)
        script = ROOT / words[1]
        if not script.is_file():
            wrong.append(f"{page}: `{command}`: no such script")
            continue
        options, required, positional = _arguments(script)
        used = {w.split("=", 1)[0] for w in words[2:] if w.startswith("--")}
        if words[2:] == ["..."] or "..." in words[2:3]:
            continue  # a sketch of the arguments, not a command
        missing = required - used
        unknown = used - options
        bare = [w for w in words[2:] if not w.startswith("-")]
        if missing or unknown or (positional and len(bare) < positional):
            wrong.append(f"{page}: `{command}`: missing {sorted(missing)}, unknown {sorted(unknown)}")
    assert not wrong, "\n".join(wrong)


def test_every_quoted_pipeline_command_exists_with_its_options():
    from typer.main import get_command

    from pipelines.cli.main import app

    cli = get_command(app)
    commands = _quoted(_PIPELINE)
    assert len(commands) > 20
    wrong = []
    for page, command in commands:
        words = _words(command)
        sub = cli.commands.get(words[1])  # type: ignore[attr-defined]
        if sub is None:
            wrong.append(f"{page}: `{command}`: no command {words[1]}")
            continue
        options = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)}
        used = {w.split("=", 1)[0] for w in words[2:] if w.startswith("-") and w not in ("-", "--")}
        unknown = {o for o in used if o not in options and not re.fullmatch(r"-o\S+", o)}
        if unknown:
            wrong.append(f"{page}: `{command}`: no option {sorted(unknown)}")
    assert not wrong, "\n".join(wrong)
