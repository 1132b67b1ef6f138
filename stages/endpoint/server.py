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

The server faces programs that may be hostile or broken (docs/agents.md, "What the endpoint
refuses"): a request's body is capped (`MAX_BODY`), a connection idle for `IDLE_TIMEOUT`
seconds is closed, the listen queue holds every episode's connections, every error is an
OpenAI-shaped JSON error, and a call must carry its episode's key
(``Authorization: Bearer <api_key>``), as the OpenAI API requires one. `Gate.close` ends every
slot at once (an engine that failed): waiting calls are answered, later ones refused.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from common import live
from stages.endpoint.gate import Gate, Reply, Slot
from stages.endpoint.messages import Refused

__all__ = ["Endpoint", "Gate", "Reply", "Slot"]

#: the largest request body served (bytes); a chat near agent.max_context is far smaller
MAX_BODY = 4 << 20
#: seconds a connection may sit idle (no request, or a request's bytes not coming) before it is closed
IDLE_TIMEOUT = 30.0
#: the listen queue's length at the least (more with more episodes: each program may hold several connections)
MIN_BACKLOG = 512
#: seconds a connection may take from the start of waiting for a request to its last byte
#: (a client trickling a byte every 29 s passes the idle check, not this one)
REQUEST_DEADLINE = 60.0
#: open connections at the most (more with more episodes); past it the answered one idle
#: longest is closed to make room, else new ones wait in the listen queue
MIN_CONNECTIONS = 64


class _Server(ThreadingHTTPServer):
    """Keeps its open connections, so that closing it ends them (and their threads)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open: dict[Any, threading.Thread] = {}
        self.waiting: dict[Any, float] = {}  # connections not in a call: since when they wait for a request
        self.answered: set[Any] = set()  # connections that were answered at least once (keep-alive)
        self.cap = MIN_CONNECTIONS
        self.lock = threading.Lock()

    def _handle_request_noblock(self) -> None:
        """Accept a connection (the serving loop calls this when one is queued). At the
        cap, the answered connection that has waited longest for its next request is
        closed to make room; with none such, the new one stays in the listen queue
        until one ends (each ends by `REQUEST_DEADLINE` at the latest)."""
        with self.lock:
            full = len(self.open) >= self.cap
            idle = [r for r in self.waiting if r in self.answered] if full else []
            oldest = min(idle, key=self.waiting.__getitem__, default=None)
            if oldest is not None:
                self.waiting.pop(oldest)
        if full and oldest is None:
            time.sleep(0.05)  # the listen queue keeps it; the loop comes back
            return
        if oldest is not None:
            _hang_up(oldest)
        super()._handle_request_noblock()  # type: ignore[misc]

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, as `ThreadingHTTPServer`'s, kept with its socket."""
        thread = threading.Thread(
            target=live.bound(self.process_request_thread), args=(request, client_address), daemon=True
        )
        with self.lock:
            self.open[request] = thread
            self.waiting[request] = time.monotonic()
        thread.start()

    def wait_from(self, request: Any, since: float | None, answered: bool = False) -> None:
        """`request` waits for a request from `since` (None: it is in a call); `answered`:
        it has been answered once."""
        with self.lock:
            if since is None:
                self.waiting.pop(request, None)
            elif request in self.open:
                self.waiting[request] = since
            if answered and request in self.open:
                self.answered.add(request)

    def service_actions(self) -> None:
        """Between polls of the serving loop: close the connections whose request has
        not come whole within `REQUEST_DEADLINE`."""
        now = time.monotonic()
        with self.lock:
            late = [r for r, since in self.waiting.items() if now - since > REQUEST_DEADLINE]
            for r in late:
                self.waiting.pop(r)
        for r in late:
            _late(r)
            _hang_up(r)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.open.pop(request, None)
            self.waiting.pop(request, None)
            self.answered.discard(request)
        super().shutdown_request(request)

    def close_all(self, wait: float = 5.0) -> None:
        """End every open connection (an idle keep-alive one included) and wait for its thread."""

        with self.lock:
            held = list(self.open.items())
        for sock, _ in held:
            with contextlib.suppress(OSError):  # closed by its client already
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + wait  # one deadline for all, not `wait` each
        for _, thread in held:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or timed out costs its connection, silently; anything
        else is the server's own defect and is printed."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _hang_up(sock: Any) -> None:
    """End a connection from outside its thread (its read returns, the thread ends)."""
    with contextlib.suppress(OSError):  # closed by its client already
        sock.shutdown(socket.SHUT_RDWR)


def _late(sock: Any) -> None:
    """Tell a connection whose request did not come whole in time so (OpenAI's shape, a 408)."""
    body = json.dumps(
        Refused(
            f"the request did not arrive whole within {REQUEST_DEADLINE:g} s", code="request_timeout", status=408
        ).body()
    ).encode()
    head = f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(OSError):
        sock.settimeout(1.0)
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)


class Endpoint:
    """An HTTP server on loopback for one `Gate`'s slots, running while in a ``with``;
    `episodes` sizes its listen queue."""

    def __init__(self, gate: Gate, model: str, episodes: int = 1) -> None:
        self.gate, self.model = gate, model
        self.server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        self.server.request_queue_size = max(MIN_BACKLOG, 8 * episodes)
        self.server.cap = max(MIN_CONNECTIONS, 8 * episodes)
        try:
            self.server.server_bind()
            self.server.server_activate()
        except OSError:
            self.server.server_close()
            raise
        self.server.endpoint = self  # type: ignore[attr-defined]
        self.thread = live.thread(self.server.serve_forever, "endpoint")

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
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.close_all()
        self.server.server_close()
        self.thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a status line even before a malformed request line's version is read
    timeout = IDLE_TIMEOUT  # the socket's: an idle or slow connection is closed, its thread freed

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the run's log says what matters (faults); a line per call would drown it

    def handle_one_request(self) -> None:
        """One request; its wait and its bytes count toward `REQUEST_DEADLINE` until it
        is read whole (`_in_call`)."""
        self.server.wait_from(self.request, time.monotonic())  # type: ignore[attr-defined]
        super().handle_one_request()
        self.server.wait_from(self.request, time.monotonic(), answered=True)  # type: ignore[attr-defined]

    def _in_call(self) -> None:
        self.server.wait_from(self.request, None)  # type: ignore[attr-defined]

    def _send(self, status: int, body: dict[str, Any], close: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The server's own errors (a malformed request line, headers too long, a method
        it has no answer for) in OpenAI's JSON error shape, not HTML; the connection is
        closed after them."""
        text = message or self.responses.get(code, ("error",))[0]
        if getattr(self, "command", None) == "HEAD":  # no body in an answer to HEAD
            self.send_response(405 if code == 501 else code)
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            return
        try:
            self._send(code, Refused(str(text), code="invalid_request", status=code).body(), close=True)
        except OSError:
            self.close_connection = True

    def _refuse(self, status: int, message: str, code: str = "invalid_request", close: bool = False) -> None:
        self._send(status, Refused(message, code=code, status=status).body(), close)

    def _route(self) -> tuple[Slot, str] | None:
        endpoint: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        slot = endpoint.gate.slots.get(parts[1]) if len(parts) >= 3 and parts[0] == "e" else None
        if slot is None:
            self._refuse(404, "no such episode: use the base_url your task was given", "not_found")
            return None
        rest = "/".join(parts[2:])
        given = self.headers.get("Authorization", "").encode("utf-8", "replace")
        if not secrets.compare_digest(given, f"Bearer {slot.key}".encode()):  # every route; in constant time
            self._refuse(
                401,
                "the api_key is missing or not this episode's: use the api_key your task was given",
                "invalid_api_key",
            )
            return None
        return slot, rest

    def _body(self) -> Any:
        """The request's JSON, `_NOT_JSON`, or None after answering a body that is not
        served (no length, a bad or negative length, over `MAX_BODY`)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._refuse(411, "send the body with a Content-Length (chunked bodies are not served)", close=True)
            return None
        given = self.headers.get("Content-Length")
        try:
            size = int(given) if given is not None else 0
        except ValueError:
            size = -1
        if size < 0:
            self._refuse(400, f"Content-Length: expected a number of bytes, got {given!r}", close=True)
            return None
        if size > MAX_BODY:
            self._refuse(
                413, f"the request body is {size} bytes; at most {MAX_BODY} are served", "request_too_large", close=True
            )
            return None
        try:
            raw = self.rfile.read(size) if size else b""
        except OSError:  # the client stopped sending (the socket's timeout)
            self.close_connection = True
            return None
        if len(raw) < size:
            self.close_connection = True
            return None
        self._in_call()
        if not raw.strip():
            return _NOT_JSON  # an empty body is no request (and JSON's null would read as "answered")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or a number past int's digit limit
            return _NOT_JSON

    def _not_allowed(self) -> None:
        self._refuse(
            405, f"{self.command} is not served: GET .../v1/models, POST .../v1/chat/completions", "method_not_allowed"
        )

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def do_GET(self) -> None:
        self._answered(self._get)

    def do_POST(self) -> None:
        self._answered(self._post)

    def _answered(self, handle: Any) -> None:
        """Every request gets a JSON answer: what `handle` raises (an environment's fault,
        a bug) is a 500 in the OpenAI API's error shape, and the server goes on serving."""
        if self.command != "POST":  # read whole (a POST is once its body is: `_body`)
            self._in_call()
        try:
            handle()
        except Exception as exc:
            with contextlib.suppress(OSError):
                self._refuse(500, f"the request failed: {type(exc).__name__}: {exc}", "server_error", close=True)

    def _get(self) -> None:
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
            self._refuse(404, f"no such route: GET /{rest}", "not_found")

    def _post(self) -> None:
        routed = self._route()
        if routed is None:
            return
        slot, rest = routed
        endpoint: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        body = self._body()
        if body is None:
            return
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
            self._refuse(404, f"no such route: POST /{rest}", "not_found")


_NOT_JSON = object()
