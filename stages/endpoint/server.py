"""The endpoint: ``/v1/chat/completions`` on loopback, one address per episode, and the
gate that turns the programs' calls into batched generate calls.

Each episode has a `Slot` and a secret path (``http://127.0.0.1:PORT/e/TOKEN/v1``), so
every call is attributed to one trajectory and episodes never see each other's chats.
A program is *running* (its own code), *waiting* (in a call) or *done*. The gate
answers calls in rounds: a round starts when no program is running, and takes every
waiting call, in episode order, as one generate call of the engine, seeded by the round
(`Gate.next_round`). So which calls share a batch depends only on what the programs
ask, not on thread timing, and a seeded run repeats. A program's own time is limited
(``agent.program.timeout``; time in calls is not counted).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    token: str = field(default_factory=lambda: secrets.token_hex(12))
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

    def add(self, slot: Slot) -> None:
        with self.cond:
            self.slots[slot.token] = slot

    def call(self, slot: Slot, body: Any) -> Reply:
        """A program's call (a request thread): wait for its round's answer."""
        with self.cond:
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


class Endpoint:
    """An HTTP server on loopback for one `Gate`'s slots, running while in a ``with``."""

    def __init__(self, gate: Gate, model: str) -> None:
        self.gate, self.model = gate, model
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.endpoint = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, name="endpoint", daemon=True)

    @property
    def root(self) -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def base_url(self, slot: Slot) -> str:
        return f"{self.root}/e/{slot.token}/v1"

    def env_url(self, slot: Slot) -> str:
        return f"{self.root}/e/{slot.token}/env"

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the run's log says what matters (faults); a line per call would drown it

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[Slot, str] | None:
        endpoint: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        slot = endpoint.gate.slots.get(parts[1]) if len(parts) >= 3 and parts[0] == "e" else None
        if slot is None:
            self._send(404, Refused("no such episode: use the base_url your task was given", status=404).body())
            return None
        return slot, "/".join(parts[2:])

    def _body(self) -> Any:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        try:
            return json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _NOT_JSON

    def do_GET(self) -> None:
        routed = self._route()
        if routed is None:
            return
        slot, rest = routed
        endpoint: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        if rest == "v1/models":
            self._send(
                200, {"object": "list", "data": [{"id": endpoint.model, "object": "model", "owned_by": "policy"}]}
            )
        elif rest == "env" and slot.env is not None:
            self._send(200, slot.env.state())
        else:
            self._send(404, Refused(f"no such route: GET /{rest}", status=404).body())

    def do_POST(self) -> None:
        routed = self._route()
        if routed is None:
            return
        slot, rest = routed
        endpoint: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        body = self._body()
        if rest == "v1/chat/completions":
            if body is _NOT_JSON:
                with endpoint.gate.cond:
                    slot.fault = slot.fault or "a malformed request: the body is not JSON"
                self._send(400, Refused("the request body is not JSON").body())
                return
            self._send(*endpoint.gate.call(slot, body))
        elif rest == "env/step" and slot.env is not None:
            action = body.get("action") if isinstance(body, dict) else None
            if not isinstance(action, str):
                self._send(400, Refused('expected {"action": "..."}', "action").body())
                return
            obs, reward, done, info = slot.env.step(action)
            self._send(
                200,
                {
                    "observation": obs,
                    "reward": reward,
                    "done": done,
                    "success": slot.env.success,
                    "valid": bool(info.get("action_valid")),
                },
            )
        else:
            self._send(404, Refused(f"no such route: POST /{rest}", status=404).body())


_NOT_JSON = object()
