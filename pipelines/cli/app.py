"""What every `pipeline` command shares: the Typer app, the common options, and how a
user mistake becomes one line and an exit status (`pipelines.cli.main`)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any

import typer

from common.errors import CatalogError, UserError
from pipelines.cli import helpfmt

helpfmt.apply()
app = typer.Typer(
    help="Declarative StarPO pipelines: validate, show, run and query them.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help, as command-line tools print it: paragraphs wrap at the terminal's width
)


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        typer.echo(f"pipeline {version('starpo-pipeline')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Declarative StarPO pipelines: validate, show, run and query them."""


def policy_version(text: str | int) -> int:
    """A policy version as a user writes it, ``20`` or ``v20`` (as the docs and
    `pipeline runs` show it)."""
    if isinstance(text, int):  # an option's default
        return text
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit():
        raise typer.BadParameter(f"expected a policy version such as 20 or v20, got {text!r}")
    return int(digits)


Overrides = Annotated[
    list[str] | None,
    typer.Option(
        "-o", "--override", metavar="KEY=VALUE", help="set a setting, e.g. -o rollout.n_groups=4 (repeatable)"
    ),
]
Imports = Annotated[
    list[str] | None,
    typer.Option(
        "--import",
        metavar="MODULE",
        help="a module of your own stages, imported before the spec is loaded (repeatable)",
    ),
]
CatalogOpt = Annotated[
    str | None,
    typer.Option(
        "--catalog", metavar="PATH", help="catalog root (default: the spec's, $PIPELINE_CATALOG or ./pipeline-data)"
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option("--address", metavar="ADDRESS", help="Ray cluster address (default: $RAY_ADDRESS, else local)"),
]


ToOpt = Annotated[
    list[str] | None,
    typer.Option("--to", metavar="NODES", help="run these nodes and what they read from (comma-separated, repeatable)"),
]
OnlyOpt = Annotated[
    list[str] | None,
    typer.Option("--only", metavar="NODES", help="run only these nodes; their inputs must be in the catalog"),
]
FromOpt = Annotated[
    list[str] | None,
    typer.Option("--from", metavar="NODES", help="run these nodes and what reads from them; the rest must be cached"),
]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character (newlines, ESC, ...) shown escaped, so
    nothing from a catalog or an error can move the cursor or recolour a terminal."""
    return _CONTROL.sub(lambda m: json.dumps(m.group())[1:-1], text)


#: seconds `leave` gives the threads and exit handlers before it ends the process anyway
LEAVE_WAIT = 15.0


def leave(code: int) -> None:
    """End the process with `code` the way the interpreter would — its thread shutdown
    (idle ``concurrent.futures`` workers woken, every other thread it would wait for
    joined), the exit handlers (``ray.shutdown`` among them), stdout and stderr flushed
    — but without the C++ static destructors that follow, where a native thread pool
    (Arrow's, DuckDB's) still holding a thread aborts the process. Only for a finished
    command: every file it writes is committed before this, so a thread or handler that
    still holds on after `LEAVE_WAIT` seconds (a library's worker left waiting by an
    interrupt) does not keep the process alive."""

    def flush() -> int:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`pipeline runs | head`): nothing more to say
                return code or 1
        return code

    watchdog = threading.Timer(LEAVE_WAIT, lambda: os._exit(flush()))
    watchdog.daemon = True
    watchdog.start()
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first when it exits
    if shutdown is not None:
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    os._exit(flush())


def fail(message: str, code: int) -> None:
    typer.echo(printable(f"error: {message}"), err=True)  # always one line
    raise typer.Exit(code)


def note(message: str) -> None:
    typer.echo(printable(f"warning: {message}"), err=True)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn project errors into one line and an exit status."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            fail(str(exc), 2)
        except CatalogError as exc:
            fail(str(exc), 1)
        except PermissionError as exc:  # a catalog of another user's, a folder this user may not write
            where = f": {exc.filename}" if exc.filename else ""
            fail(
                f"permission denied{where} (this user may not read or write there; a catalog shared with others is "
                "read with query, runs, verify or report, and written by users its folders let write)",
                1,
            )
        except KeyboardInterrupt as exc:
            fail("interrupted; run the same command again to resume", 128 + getattr(exc, "signum", signal.SIGINT))

    return wrapper


def usage_error(exc: Exception) -> int | None:
    """The exit status for a command line the parser refused, its one line printed (bare
    `pipeline`: the help, status 0), or None for any other exception. Typer carries its
    own copy of click, so its errors are known by their class names."""
    kinds = {k.__name__ for k in type(exc).__mro__}
    if "NoArgsIsHelpError" in kinds:
        typer.echo(exc.ctx.get_help())  # type: ignore[attr-defined]
        return 0
    if "UsageError" in kinds:  # a wrong option or argument: one line, as every user mistake
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "pipeline"
        message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
        typer.echo(printable(f"error: {command}: {message} (see {command} --help)"), err=True)
        return 2
    if "Abort" in kinds:
        typer.echo("error: interrupted", err=True)
        return 130
    return None


def load(spec: str, overrides: list[str] | None, imports: list[str] | None = None) -> Any:
    import stages  # noqa: F401  (registers the stages)
    from pipelines.graph.load import load_spec

    return load_spec(spec, overrides or [], tuple(imports or ()))
