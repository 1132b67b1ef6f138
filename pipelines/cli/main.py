"""The `pipeline` command.

A user mistake (bad spec, override, name or query) prints one line,
``error: <file>: <key>: <what was expected>``, and exits 2. A stage that fails
prints one line and exits 1; its traceback is written to
``<catalog>/runs/<run>/error.txt`` (or shown with ``--debug``).
"""

from __future__ import annotations

import sys

# each module registers its commands on `app`; `pipeline --help` lists them in this order
# isort: off
from pipelines.cli import spec, run, catalog, models  # noqa: F401

# isort: on
from pipelines.cli.app import app, usage_error


def invoke(argv: list[str] | None = None) -> int:
    """Run one command line (``sys.argv`` by default) and return its exit status."""
    try:
        code = app(args=argv, prog_name="pipeline", standalone_mode=False)  # `typer.Exit(n)` comes back as n
    except Exception as exc:
        answered = usage_error(exc)
        if answered is None:
            raise
        return answered
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """The console script. It leaves without the interpreter's teardown once the
    command is done (`pipelines.cli.app.leave`): the native thread pools of Arrow and
    DuckDB can abort a finished command there ("terminate called without an active
    exception", exit -6), after every file was written."""
    from pipelines.cli.app import leave

    leave(invoke())
