"""The gate between the endpoint's calls and the engine: a `Slot` per episode, and the
rounds in which the programs' waiting calls are answered as one generate call
(`Gate.next_round`; the module docstring of `stages.endpoint.server` tells the rules)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stages.endpoint.messages import Refused, Request, parse
from stages.endpoint.programs import ActedEnv
from stages.endpoint.transcript import Answer, Transcript

Reply = tuple[int, dict[str, Any]]


@dataclass
class Slot:
    """One episode's place at the endpoint."""

    index: int
    transcript: Transcript
    max_calls: int
    token: str = field(default_factory=lambda: secrets.token_hex(12))  # the episode's path: it routes
    key: str = field(default_factory=lambda: secrets.token_hex(16))  # the api_key: it admits, on every route
    env: ActedEnv | None = None
    state: str = "running"  # running | waiting | done
    used: float = 0.0  # seconds of the program's own time before `since`
    since: float = field(default_factory=time.monotonic)
    request: Request | None = None
    reply: Reply | None = None
    answers: list[Answer] = field(default_factory=list)
    fault: str | None = None  # what cost the episode
    end: str = ""  # why calls stopped being answered, where not a fault: context, turns
    stop: Callable[[], None] | None = None  # kills a command past its time
    thread: threading.Thread | None = None  # the program's (a function's) or its waiter's (a command's)

    @property
    def over(self) -> bool:
        """Whether no further call is answered."""
        return bool(self.fault or self.end)


class Gate:
    """Calls in, rounds out (see the module docstring)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.slots: dict[str, Slot] = {}
        self.cond = threading.Condition()

        self.closed: str | None = None  # why every slot was ended (`close`)

    def add(self, slot: Slot) -> None:
        with self.cond:
            self.slots[slot.token] = slot

    def close(self, why: str) -> None:
        """End every slot now (the batch failed): a waiting call is answered with an
        error, later calls are refused, running programs are stopped where they can be
        (a command is killed; a function's thread cannot be, and its calls are refused)."""
        with self.cond:
            self.closed = why
            for slot in self.slots.values():
                if slot.state != "done":
                    slot.fault = slot.fault or why
                if slot.env is not None:
                    slot.env.freeze()
                if slot.state == "waiting":
                    slot.reply = (500, Refused(why, code="server_error", status=500).body())
                slot.state = "done"
                if slot.stop is not None:
                    slot.stop()
            self.cond.notify_all()

    def call(self, slot: Slot, body: Any) -> Reply:
        """A program's call (a request thread): wait for its round's answer."""
        with self.cond:
            if self.closed is not None:
                return _ended(slot, f"the episode has ended ({self.closed})")
            if slot.state == "done":
                return _ended(slot, "the episode's program has ended")
            if slot.over:
                return _ended(slot, f"the episode has ended ({slot.fault or slot.end})")
            if slot.state == "waiting":
                return 409, Refused("one call at a time per episode", code="conflict", status=409).body()
            if len(slot.answers) >= slot.max_calls:
                slot.end = "turns"
                return _ended(slot, f"the episode's {slot.max_calls} calls (agent.max_turns) are spent")
            try:
                slot.request = parse(body)
            except Refused as exc:
                slot.fault = f"a malformed request: {exc.message}"
                return exc.status, exc.body()
            slot.state, slot.reply = "waiting", None
            slot.used += time.monotonic() - slot.since
            self.cond.notify_all()
            while slot.reply is None and slot.state == "waiting":
                self.cond.wait()
            return slot.reply or _ended(slot, "the episode has ended")

    def finish(self, slot: Slot) -> None:
        """The program has returned or raised (its thread)."""
        with self.cond:
            slot.state = "done"
            self.cond.notify_all()

    def next_round(self) -> list[Slot] | None:
        """Wait until no program is running; the slots with a call waiting, in episode
        order, or None when every program is done. A program past its time is faulted."""
        with self.cond:
            while True:
                now = time.monotonic()
                running = [s for s in self.slots.values() if s.state == "running"]
                for s in running:
                    if s.used + now - s.since > self.timeout:
                        s.fault = s.fault or f"the program ran past its time limit ({self.timeout:g} s of its own time)"
                        s.state = "done"
                        if s.env is not None:
                            s.env.freeze()  # a function's thread runs on (Python cannot stop it): its steps change nothing
                        if s.stop is not None:
                            s.stop()
                running = [s for s in running if s.state == "running"]
                if not running:
                    waiting = sorted((s for s in self.slots.values() if s.state == "waiting"), key=lambda s: s.index)
                    if waiting or all(s.state == "done" for s in self.slots.values()):
                        return waiting or None
                left = min(self.timeout - s.used - (now - s.since) for s in running) if running else 1.0
                self.cond.wait(timeout=max(0.01, left))

    def answer(self, slot: Slot, reply: Reply) -> None:
        """Give a waiting call its answer: the program runs again from now."""
        with self.cond:
            slot.reply, slot.state, slot.since = reply, "running", time.monotonic()
            self.cond.notify_all()


def _ended(slot: Slot, why: str) -> Reply:
    return 400, Refused(why, code="episode_ended").body()
