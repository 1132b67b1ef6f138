"""Environments served by another process, over HTTP with JSON.

Environments such as WebShop or ALFWorld run as their own services. `EnvServer`
exposes any registered environment with the same protocol; `ServedEnv` (registered
as ``served``) is a client that behaves like a local environment:

    server = EnvServer(port=0).start()            # or: python -m envs.served --port 8765
    env = envs.make("served", url=server.url, env="sokoban", options={"num_boxes": 1})

Endpoints (POST, JSON bodies): ``/create {env, options}`` -> ``{id, action_words,
instructions, budget}``; ``/reset {id, seed}`` -> ``{text}``; ``/step {id, action}``
-> ``{text, reward, done, info}``; ``/close {id}``. A refusal of ``/create`` (HTTP 4xx:
an unknown environment, a bad option) raises `EnvError`: the spec is wrong. Any other
failure raises `EnvFault` naming the URL: HTTP 5xx, no answer within `timeout`, a
dropped or refused connection, a reply that is not JSON or lacks its keys, and a 4xx
to a call on an environment already made (a server restarted since answers "no
environment with id"). The calls that can be repeated (``/create``, ``/reset``: a reset
with a seed gives the same state again) are tried `retries` more times (0.5 s, 1 s, ...
apart); a ``/step`` is never repeated (the server may have taken it), and a failed
``/close`` is ignored. It never hangs past `timeout` a try.

A server whose calls failed every try `DOWN_AFTER` times in a row is taken for down:
for `DOWN_FOR` seconds every call to it fails at once, then one is tried again. A dead
or hung server then costs a stage about `DOWN_AFTER` calls' tries, not every
episode's: its episodes fail fast, and the stage fails on the share of failed episodes
it allows (`stages.agent.play.drop_faults`).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn, TypeVar

from common import live
from envs.base import Budget, EnvError, EnvFault, StepResult, TextEnv
from envs.registry import make

_T = TypeVar("_T")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            reply, status = self.server.owner.handle(self.path, body), 200
        except EnvError as exc:
            reply, status = {"error": str(exc)}, 400
        except Exception as exc:  # report, keep serving
            reply, status = {"error": f"{type(exc).__name__}: {exc}"}, 500
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: EnvServer


class EnvServer:
    """Serves registered environments on `host:port` (port 0: any free port)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.httpd = _Server((host, port), _Handler)
        self.httpd.owner = self
        self.envs: dict[str, tuple[TextEnv, threading.Lock]] = {}
        self.ids = itertools.count(1)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def handle(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/create":
            env = make(str(body.get("env")), **dict(body.get("options") or {}))
            env_id = str(next(self.ids))
            self.envs[env_id] = (env, threading.Lock())
            return {
                "id": env_id,
                "action_words": list(env.action_words),
                "instructions": env.instructions,
                "budget": asdict(env.budget),
            }
        env_id = str(body.get("id"))
        if env_id not in self.envs:
            raise EnvError(f"no environment with id '{env_id}' on this server")
        env, lock = self.envs[env_id]
        with lock:
            if path == "/reset":
                return {"text": env.reset(int(body["seed"]))}
            if path == "/step":
                text, reward, done, info = env.step(str(body.get("action", "")))
                return {"text": text, "reward": reward, "done": done, "info": info}
            if path == "/render":
                return {"text": env.render()}
            if path == "/close":
                del self.envs[env_id]
                return {}
        raise EnvError(f"unknown endpoint '{path}'")

    def start(self) -> EnvServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass(frozen=True)
class ServedOptions:
    url: str = "http://127.0.0.1:8765"  # the server's base URL
    env: str = "sokoban"  # the environment's name on the server
    options: dict = field(default_factory=dict)  # options for that environment
    timeout: float = 10.0  # seconds to wait for any answer
    retries: int = 2  # more tries of a call that can be repeated (/create, /reset) after a fault


#: calls to one server that failed every try, one after another, past which it is taken for down
DOWN_AFTER = 2
#: seconds a server taken for down has its calls fail at once before one is tried again
DOWN_FOR = 30.0


@dataclass
class _Health:
    """What this process knows of one server: calls failed in a row, and until when it is taken for down."""

    failed: int = 0
    down_until: float = 0.0
    last: str = ""
    kept: dict[str, Any] = field(default_factory=dict)  # what `read_once` read of it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refusal(self, where: str) -> EnvFault | None:
        with self.lock:
            if time.monotonic() >= self.down_until:
                return None
            return EnvFault(
                f"{where}: not tried, the server failed {self.failed} calls in a row (the last: {self.last}); "
                f"taken for down for {DOWN_FOR:g} s"
            )

    def answered(self) -> None:
        with self.lock:
            self.failed, self.down_until = 0, 0.0

    def gave_up(self, fault: EnvFault) -> None:
        with self.lock:
            self.failed += 1
            self.last = str(fault).split(": ", 1)[-1]
            if self.failed >= DOWN_AFTER:
                self.down_until = time.monotonic() + DOWN_FOR


class Refused(EnvFault):
    """A refusal by a server that is up, of a call on an environment it no longer has
    (module docstring): nothing to try again, and no sign the server is down."""


_HEALTH_LOCK = threading.Lock()


class _Servers(dict[str, _Health]):
    """The run's slot (`common.live`): what it learnt of each server, by address; a
    server marked down stays so for the run that saw it fail, not for the next."""

    def close(self) -> None:
        self.clear()


def forget_health() -> None:
    """Forget what this run learnt of every server (a test's servers reuse ports)."""
    with _HEALTH_LOCK:
        live.slot("env servers", _Servers).clear()


def _health(url: str) -> _Health:
    with _HEALTH_LOCK:
        return live.slot("env servers", _Servers).setdefault(url.rstrip("/"), _Health())


def read_once(url: str, what: str, read: Callable[[], _T]) -> _T:
    """`read()`'s answer about the server at `url` (its schema, say), kept with what this
    run learnt of it: read once a run, and forgotten with the rest (`forget_health`)."""
    health = _health(url)
    with health.lock:
        if what in health.kept:
            return health.kept[what]
    answer = read()  # not under the lock: `guarded` takes it
    with health.lock:
        return health.kept.setdefault(what, answer)


def guarded(url: str, where: str, tries: int, once: Callable[[], _T]) -> _T:
    """`once()` tried up to `tries` times (0.5 s, 1 s, ... apart) while it raises
    `EnvFault`, unless the server at `url` is taken for down (module docstring); what
    this run learns of the server is kept. A `Refused` fault (the server is up; what it
    lost is not worth another try) is raised at once. `where` names the call in a refusal."""
    health = _health(url)
    refused = health.refusal(where)
    if refused is not None:
        raise refused
    for attempt in range(tries):
        try:
            reply = once()
        except Refused:
            health.answered()
            raise
        except EnvFault as fault:
            if attempt + 1 == tries:
                health.gave_up(fault)
                raise
            time.sleep(0.5 * 2**attempt)
        else:
            health.answered()
            return reply
    raise AssertionError("unreachable")


class ServedEnv(TextEnv):
    """A client of an `EnvServer` (see the module docstring)."""

    def __init__(self, opts: ServedOptions) -> None:
        super().__init__()
        self.opts = opts
        reply = self._call(
            "/create", {"env": opts.env, "options": opts.options}, ("id", "action_words", "instructions")
        )
        self.env_id = reply["id"]
        self._words = tuple(reply["action_words"])
        self._instructions = reply["instructions"]
        if reply.get("budget"):
            self.budget = Budget(**reply["budget"])
        self._text = ""

    def _call(self, path: str, body: dict[str, Any], keys: tuple[str, ...] = ()) -> dict[str, Any]:
        """The server's reply to `path`, holding `keys` (module docstring: what is tried again)."""
        tries = 1 + (max(0, self.opts.retries) if path in ("/create", "/reset") else 0)
        return guarded(self.opts.url, f"served env {self.opts.url}{path}", tries, lambda: self._once(path, body, keys))

    def _once(self, path: str, body: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        url = self.opts.url.rstrip("/") + path
        where = f"served env {self.opts.url}{path}"
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.opts.timeout) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read() or b"{}").get("error", exc.reason)
            except (ValueError, AttributeError, OSError):
                detail = exc.reason
            if 400 <= exc.code < 500 and path == "/create":
                raise EnvError(f"served env {self.opts.url}: {detail}") from None
            if 400 <= exc.code < 500:  # the environment it made is gone: the server restarted, or lost it
                raise Refused(f"{where}: refused ({exc.code}: {detail})") from None
            raise EnvFault(f"{where}: server error {exc.code} ({detail})") from None
        except TimeoutError:
            raise EnvFault(f"{where}: no answer within {self.opts.timeout:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise EnvFault(f"{where}: no answer within {self.opts.timeout:g} s") from None
            raise EnvFault(f"{where}: cannot reach the server ({exc.reason})") from None
        except (http.client.HTTPException, ConnectionError, OSError) as exc:
            raise EnvFault(f"{where}: the connection broke ({type(exc).__name__}: {exc})") from None
        try:
            reply = json.loads(data)
        except ValueError:
            raise EnvFault(f"{where}: the reply is not JSON ({data[:60]!r})") from None
        missing = [k for k in keys if not isinstance(reply, dict) or k not in reply]
        if missing:
            raise EnvFault(f"{where}: the reply lacks {', '.join(missing)}") from None
        return reply

    @property
    def action_words(self) -> tuple[str, ...]:
        return self._words

    @property
    def instructions(self) -> str:
        return self._instructions

    def reset(self, seed: int, split: str | None = None) -> str:
        """A served environment holds no state out: `split` is accepted and not used."""
        self.done = self.success = False
        self._text = self._call("/reset", {"id": self.env_id, "seed": seed}, ("text",))["text"]
        return self._text

    def step(self, action: str) -> StepResult:
        body = {"id": self.env_id, "action": action if isinstance(action, str) else ""}
        reply = self._call("/step", body, ("text", "reward", "done", "info"))
        try:
            text, reward, done, info = str(reply["text"]), float(reply["reward"]), bool(reply["done"]), reply["info"]
            success = bool(info.get("success", False))
        except (TypeError, ValueError, AttributeError) as exc:
            raise EnvFault(f"served env {self.opts.url}/step: a reply of the wrong form ({exc})") from None
        self._text, self.done, self.success = text, done, success
        return text, reward, done, info

    def render(self) -> str:
        return self._text

    def _reset(self, seed: int) -> None:  # pragma: no cover - reset is overridden
        raise NotImplementedError

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        with contextlib.suppress(EnvFault):  # the server frees it, or has lost it already
            self._call("/close", {"id": self.env_id})


def _fail(message: str) -> NoReturn:
    """A user's mistake: one line, exit 2 (as the pipeline's commands)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the registered environments over HTTP.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--protocol",
        choices=("served", "openenv"),
        default="served",
        help="served: ours, every environment (env: served); openenv: one environment, for OpenEnv clients",
    )
    parser.add_argument("--env", default="sokoban", help="openenv: the environment served")
    parser.add_argument("--options", default="{}", help="openenv: its options, as a JSON object")
    parser.add_argument("--max-sessions", type=int, default=256, help="openenv: sessions (episodes) at once")
    args = parser.parse_args(argv)
    if args.protocol == "openenv":
        try:
            options = json.loads(args.options)
            if not isinstance(options, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            _fail(f"--options: a JSON object of the environment's options ({exc})")
        try:
            from envs.openenv_server import serve
        except ImportError:
            _fail("--protocol openenv needs openenv-core: pip install -e '.[openenv]'")
        try:
            serve(args.host, args.port, args.env, options, args.max_sessions)
        except EnvError as exc:
            _fail(str(exc))
        return
    server = EnvServer(args.host, args.port)
    print(f"serving environments on {server.url}", flush=True)
    server.httpd.serve_forever()
