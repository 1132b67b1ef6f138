"""Help that reads as a command line: ``pipeline run [OPTIONS] SPEC``, ``--debug``,
``-o, --override KEY=VALUE``, ``--catalog PATH``; never Python's types.

Typer draws each parameter's Python type (``<bool>``, ``<list[str]>``, ``spec <str>``)
and braces a required argument in the usage line (``{spec}``). `apply` replaces those
three pieces of its help with what command-line tools print: an argument's name in
capitals, an option's metavar (its own, else the type's word in capitals, as click writes
it: TEXT, INTEGER, FLOAT), nothing for a flag. Called once, where the app is made;
tests/pipelines/cli check every command's help."""

from __future__ import annotations

from typing import Any

from typer import core


def _argument_name(param: Any) -> str:
    name = param.metavar or str(param.name).upper()
    return name + ("..." if param.nargs != 1 else "")


def _usage(param: Any) -> str:
    name = _argument_name(param)
    return name if param.required else f"[{name}]"


#: Python's type names as command-line help writes a value's kind
_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "Path": "PATH", "bool": "BOOLEAN"}


def _option_value(param: Any, ctx: Any) -> str | None:
    if param.is_flag or param.count:
        return None
    if param.metavar is not None:
        return str(param.metavar)
    label = param.display_type(ctx).strip("<>")
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]  # a repeatable option: its help says so
    if "|" in label:
        return f"[{label}]"
    label = label.removesuffix(" range")  # the bounds follow in the help: [x>=0]
    return _WORDS.get(label, label.upper())


def apply() -> None:
    """Patch Typer's help of arguments and options (module docstring)."""
    core.TyperArgument._rich_display_name = _argument_name
    core.TyperArgument._usage_display_name = _usage
    core.TyperArgument.display_type_rich = lambda self, ctx: None
    core.TyperOption.display_type_rich = _option_value
