"""A run's live state, and its one owner.

What a run holds in memory outside the catalog — the resident trainer and the weights
it published, the held critic, the engine host, the env servers' health, the nodes a
worker group shuns or that were already lost — lives in one `Live` object that the run
opens (`scope`) and closes when it ends, on success, on error and on interrupt. Each
module keeps its part in a *slot* of the open `Live` (`slot`), made on first use and
closed with it; nothing of it stays in module globals, so two runs in one process share
nothing, and a run's threads, processes and memory go with it (docs/architecture.md,
"Live state").

Registries of definitions (stages, environments, estimators) are not live state: they
are filled on import and stay.

Outside a run (a test, a script, `pipeline score`), the slots belong to a process-wide
`Live` that `close_ambient` ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


class Live:
    """The live state of one run: named slots, each closed (in the reverse order of
    their making) by `close`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.slots: dict[str, Closable] = {}
        self.lock = threading.RLock()
        self.closed = False

    def slot(self, name: str, make: Callable[[], S]) -> S:
        """The slot `name`, made by `make()` on first use."""
        with self.lock:
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
_OPEN: list[Live] = []  # the run's Live while one is open (a stack: a sweep trial's run inside a sweep)
_AMBIENT = Live("ambient")


def current() -> Live:
    """The open run's `Live`, else the process-wide one (module docstring)."""
    with _LOCK:
        return _OPEN[-1] if _OPEN else _AMBIENT


def slot(name: str, make: Callable[[], S]) -> S:
    """The slot `name` of the current `Live` (`Live.slot`)."""
    return current().slot(name, make)


@contextlib.contextmanager
def scope(name: str) -> Iterator[Live]:
    """Open a run's `Live` for the block, and close it when the block ends, however
    it ends. What was held outside any run is closed first: a run starts from nothing."""
    close_ambient()
    live = Live(name)
    with _LOCK:
        _OPEN.append(live)
    try:
        yield live
    finally:
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
