"""A Ray call that cannot go on because nodes were lost fails, instead of waiting.

Ray replaces what a lost node held where the cluster left can hold it: engine actors
restart (`stages.engines.hosts`), and Ray Train starts the worker group again
(`stages.training.fit`), so the result is the same. Where it cannot (the nodes left
have fewer CPUs or GPUs than the call needs), Ray waits for resources without end: a
run would sit at "0/3 mini-batches" for ever. `watched` runs such a call and, once the
live nodes have stayed short of what it needs for `wait_seconds`, fails it with one
line naming the lost nodes, so the step commits nothing and the same command, run once
the nodes are back, resumes the run.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from common import live

T = TypeVar("T")

#: how long a call waits for lost resources to come back before it fails
WAIT_ENV = "PIPELINE_NODE_WAIT_SECONDS"
DEFAULT_WAIT = 120.0


class NodesLost(RuntimeError):
    """Nodes were lost and the cluster left cannot hold the call."""


def wait_seconds() -> float:
    """`DEFAULT_WAIT`, or ``$PIPELINE_NODE_WAIT_SECONDS``."""
    try:
        return max(0.0, float(os.environ.get(WAIT_ENV, DEFAULT_WAIT)))
    except ValueError:
        return DEFAULT_WAIT


@dataclass
class _Nodes:
    """The run's slot (`common.live`): `before`, the nodes already dead when this process
    joined its Ray session (`note_session`): a long-lived or autoscaling cluster lists
    every node it ever lost, and those are not ours; `seen`, when `watched` first saw each
    node dead (time.monotonic): a call counts only recent losses."""

    before: set[str] = field(default_factory=set)
    seen: dict[str, float] = field(default_factory=dict)

    def close(self) -> None:
        self.before.clear()
        self.seen.clear()


def _nodes() -> _Nodes:
    return live.slot("lost nodes", _Nodes)


def note_session() -> None:
    """Remember the nodes already dead in the Ray session just joined: `watched` then counts
    only nodes lost since (a run calls this at its first use of Ray, whoever started it:
    `pipelines.run.session`)."""
    import ray

    _nodes().close()
    if not ray.is_initialized():
        return
    try:
        _nodes().before.update(n["NodeID"] for n in ray.nodes() if not n.get("Alive"))
    except Exception:  # the cluster did not answer: every dead node counts, as before
        _nodes().before.clear()


def _dead() -> dict[str, str]:
    """The cluster's nodes that Ray has marked dead since this process joined it: node id ->
    address."""
    import ray

    return {
        n["NodeID"]: n.get("NodeManagerAddress", "")
        for n in ray.nodes()
        if not n.get("Alive") and n["NodeID"] not in _nodes().before
    }


def short_of(need: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Resources the live nodes have less of, in all, than `need`: name -> (have, need)."""
    import ray

    have = ray.cluster_resources()
    return {r: (float(have.get(r, 0.0)), n) for r, n in need.items() if n > 0 and have.get(r, 0.0) < n}


#: seconds `watched` waits for the call's thread to end once `stop` was called
STOP_WAIT = 10.0


def watched(
    call: Callable[[], T],
    need: Mapping[str, float],
    what: str,
    poll: float = 1.0,
    stop: Callable[[], None] | None = None,
) -> T:
    """``call()`` (blocking Ray work that needs `need`, e.g. ``{"CPU": 2}``, while it
    runs), in a thread; its result or its exception. If nodes were lost and the live
    ones stay short of `need` for `wait_seconds`, raise `NodesLost`, after ``stop()``
    (which ends the call's Ray work: a fit's controller, a group's members) and up to
    `STOP_WAIT` seconds for the call's thread to end, so that nothing of the call still
    runs on what the caller then removes (its folders, its placement group). Without
    `stop` the thread is left behind, waiting on Ray, which ends it with the driver.
    A node lost just before the call (its actors already waiting) counts: a node lost since
    this process joined the cluster (`note_session`) and first seen dead by a watched call
    no longer than one wait before this one started, or during it; a node lost long before
    (an autoscaler's scale-down) does not make a wait for capacity fail."""
    if not any(n > 0 for n in need.values()):  # needs nothing a lost node takes (local mode, unreserved actors)
        return call()
    box: dict[str, Any] = {}
    # a node lost long before this call (an autoscaler's scale-down an hour ago) is not why
    # it waits: only those first seen dead within one wait of its start, or during it, count
    since = time.monotonic() - wait_seconds()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = live.thread(run, f"watched {what}")
    thread.start()
    short_since: float | None = None
    while thread.is_alive():
        thread.join(poll)
        if not thread.is_alive():
            break
        try:
            lost, missing = _dead(), short_of(need)
        except Exception:  # the cluster did not answer this time: ask again
            continue
        now = time.monotonic()
        lost = {n: a for n, a in lost.items() if _nodes().seen.setdefault(n, now) >= since}
        if not lost or not missing:
            short_since = None
            continue
        short_since = short_since if short_since is not None else time.monotonic()
        if time.monotonic() - short_since >= wait_seconds():
            names = ", ".join(f"{n[:12]} ({address})" for n, address in sorted(lost.items()))
            shortfall = ", ".join(f"{have:g} of the {n:g} {r} it needs" for r, (have, n) in missing.items())
            if stop is not None:
                with contextlib.suppress(Exception):  # the cluster is in trouble: stop what can be stopped
                    stop()
                thread.join(STOP_WAIT)
            raise NodesLost(
                f"{what}: node(s) {names} lost, and the nodes left have {shortfall}; "
                f"waited {wait_seconds():g} s (${WAIT_ENV}); start the node(s) again and run the same command to resume"
            )
    if "error" in box:
        raise box["error"]
    return box["value"]


#: how often an actor that cannot be reached is called again (`patient`)
RETRY_EVERY = 1.0


def patient(submit: Callable[[], Any], idle: float = RETRY_EVERY) -> Any:
    """``ray.get(submit())`` for an actor call that may be made again (the same answer each
    time): while the actor cannot be
    reached (``ActorUnavailableError``: its node was lost and Ray has not yet marked it
    dead, which takes its health checks several seconds, or it is restarting), the call is
    submitted again every `idle` seconds. Once Ray marks the node dead it restarts the
    actor elsewhere (the call is then answered) or gives it up (``ActorDiedError``, raised
    as any other error is): the loop ends with Ray's verdict, and `wait_seconds` bounds it
    should Ray never give one."""
    import ray
    from ray.exceptions import ActorUnavailableError

    deadline = time.monotonic() + max(wait_seconds(), 10 * idle)
    ref = submit()
    while True:
        try:
            return ray.get(ref)
        except ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(idle)
            ref = submit()
