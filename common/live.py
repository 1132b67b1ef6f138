"""A run's live state, and its one owner.

What a run holds in memory outside the catalog — the resident trainer and the weights
it published, the held critic, the engine host and engine actors, the env servers'
health, the nodes a worker group shuns or that were already lost, the data files read —
lives in one `Live` object that the run opens (`scope`) and closes when it ends, on
success, on error and on interrupt. Each module keeps its part in a *slot* of the open
`Live` (`slot`), made on first use and closed with it; nothing of it stays in module
globals, so two runs in one process share nothing, and a run's threads, processes and
memory go with it (docs/architecture.md, "Live state").

Which `Live` is open is a context variable, not a process-wide stack: a thread the run
starts with `bound` (or `thread`) keeps the run's owner, and a straggler thread that
outlives its run (an interrupt left it behind) finds its owner closed — `slot` raises
`Ended` — instead of making its state in the next run's owner.

Registries of definitions (stages, environments, estimators) are not live state: they
are filled on import and stay.

Outside a run (a test, a script, `pipeline score`), the slots belong to a process-wide
`Live` that `close_ambient` ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closable)
P = ParamSpec("P")
R = TypeVar("R")


class Ended(RuntimeError):
    """A slot was asked of a run's owner after the run ended (a thread that outlived it)."""


class Live:
    """The live state of one run: named slots, each closed (in the reverse order of
    their making) by `close`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.slots: dict[str, Closable] = {}
        self.lock = threading.RLock()
        self.closed = False

    def slot(self, name: str, make: Callable[[], S]) -> S:
        """The slot `name`, made by `make()` on first use; `Ended` once closed."""
        with self.lock:
            if self.closed:
                raise Ended(f"run {self.name!r} has ended: nothing more is kept for it ({name})")
            if name not in self.slots:
                self.slots[name] = make()
            return self.slots[name]  # type: ignore[return-value]

    def close(self) -> None:
        """Close every slot (newest first); a slot that fails to close does not keep
        the others open: the first error is raised after all were tried."""
        with self.lock:
            slots, self.slots, self.closed = list(self.slots.values()), {}, True
        failed: BaseException | None = None
        for held in reversed(slots):
            try:
                held.close()
            except BaseException as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


_LOCK = threading.Lock()
_CURRENT: contextvars.ContextVar[Live | None] = contextvars.ContextVar("live", default=None)
_OPEN: list[Live] = []  # every run's Live while open, for `held` only (not who is current)
_AMBIENT = Live("ambient")


def current() -> Live:
    """The open run's `Live` in this context, else the process-wide one (module docstring)."""
    live = _CURRENT.get()
    if live is not None:
        return live
    with _LOCK:
        return _AMBIENT


def slot(name: str, make: Callable[[], S]) -> S:
    """The slot `name` of the current `Live` (`Live.slot`)."""
    return current().slot(name, make)


def bound(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, to run in another thread as part of this context's run (a new thread, or
    a pool's, starts with no run of its own)."""
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.copy().run(fn, *args, **kwargs)

    return run


def thread(target: Callable[[], Any], name: str, daemon: bool = True) -> threading.Thread:
    """A thread (not started) that runs `target` as part of this context's run."""
    return threading.Thread(target=bound(target), name=name, daemon=daemon)


@contextlib.contextmanager
def scope(name: str) -> Iterator[Live]:
    """Open a run's `Live` for the block, and close it when the block ends, however
    it ends. What was held outside any run is closed first: a run starts from nothing."""
    close_ambient()
    live = Live(name)
    with _LOCK:
        _OPEN.append(live)
    token = _CURRENT.set(live)
    try:
        yield live
    finally:
        _CURRENT.reset(token)
        with _LOCK:
            _OPEN.remove(live)
        live.close()


def close_ambient() -> None:
    """Close what is held outside any run."""
    global _AMBIENT
    with _LOCK:
        ambient, _AMBIENT = _AMBIENT, Live("ambient")
    ambient.close()


def held() -> dict[str, list[str]]:
    """The slots held now, by owner (what a test checks is empty after a run)."""
    with _LOCK:
        owners = [*_OPEN, _AMBIENT]
    return {live.name: sorted(live.slots) for live in owners if live.slots}
