"""The endpoint against hostile and broken clients: malformed, oversized, slow, concurrent
and cross-episode requests, each answered in OpenAI's JSON error shape or with its
episode's fault, never the batch's; and what a failed batch leaves behind (nothing)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from stages.agent.loop import AGENT_FAULT, AgentConfig
from stages.endpoint import server
from stages.endpoint.programs import ProgramConfig, python_command
from stages.endpoint.rendering import Template
from stages.endpoint.server import Endpoint, Gate, Slot
from stages.engines import Completion, SamplingParams
from tests.fixtures.real_models import qwen25_tokenizer
from tests.stages.endpoint.test_episodes import PROGRAMS, Saying, play


class Served:
    """A gate with `n` episodes behind a live endpoint, and a thread that answers every
    round with a fixed completion body (no engine)."""

    def __init__(self, n: int, timeout: float = 30.0) -> None:
        self.gate = Gate(timeout)
        self.slots = [Slot(k, None, max_calls=1000) for k in range(n)]  # type: ignore[arg-type]
        for slot in self.slots:
            self.gate.add(slot)
        self.endpoint = Endpoint(self.gate, "m", n)
        self.answerer = threading.Thread(target=self._answer, daemon=True)

    def _answer(self) -> None:
        while (waiting := self.gate.next_round()) is not None:
            for slot in waiting:
                self.gate.answer(slot, (200, {"ok": slot.index}))

    def __enter__(self) -> Served:
        self.endpoint.__enter__()
        self.answerer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.close("the test ended")
        self.endpoint.__exit__()
        self.answerer.join(timeout=5)

    @property
    def port(self) -> int:
        return self.endpoint.server.server_address[1]

    def path(self, k: int = 0, rest: str = "v1/chat/completions") -> str:
        return f"/e/{self.slots[k].token}/{rest}"

    def key(self, k: int = 0) -> str:
        return f"Bearer {self.slots[k].key}"


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` bytes on a new connection; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        want = int(headers.get("content-length", 0))
        while len(body) < want:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = {"Host": "x", "Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items() if v is not None)
    return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def error(body: bytes) -> dict[str, Any]:
    """The OpenAI-shaped error of an answer's body (fails on anything else, HTML included)."""
    got = json.loads(body)
    assert set(got) == {"error"} and {"message", "type", "param", "code"} <= set(got["error"]), got
    return got["error"]


def test_bodies_that_are_not_served_get_a_json_error_at_once():
    with Served(1) as s:
        key = {"Authorization": s.key()}
        # 50 MB announced, a few bytes sent: refused from the header, nothing read or parsed
        started = time.monotonic()
        status, _, body = exchange(s.port, request("POST", s.path(), b"{", {**key, "Content-Length": str(50 << 20)}))
        assert status == 413 and error(body)["code"] == "request_too_large"
        assert time.monotonic() - started < 2
        for length in ("-1", "abc"):
            status, _, body = exchange(s.port, request("POST", s.path(), b"{}", {**key, "Content-Length": length}))
            assert status == 400 and "Content-Length" in error(body)["message"], length
        status, _, body = exchange(
            s.port, request("POST", s.path(), b"", {**key, "Content-Length": None, "Transfer-Encoding": "chunked"})
        )
        assert status == 411
        status, _, body = exchange(s.port, request("POST", s.path(), b"[" * 100_000, key))
        assert status == 400 and "not JSON" in error(body)["message"]


def test_every_bad_request_gets_a_json_answer_and_the_server_goes_on(monkeypatch):
    """Issue 93: an empty body, a 5,000-digit integer and an environment that faults got
    no answer at all (the handler died with a traceback). Each gets an OpenAI-shaped error
    (and costs its own episode), and another episode's request is served."""
    with Served(2) as s:
        key = {"Authorization": s.key()}
        status, _, body = exchange(s.port, request("POST", s.path(), b"", key))
        assert status == 400 and "not JSON" in error(body)["message"]
        huge = b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b"}"
        status, _, body = exchange(s.port, request("POST", s.path(), huge, key))
        assert status == 400 and "not JSON" in error(body)["message"]

        class Faulty:
            success = False

            def step(self, action: str) -> Any:
                from envs.base import EnvFault

                raise EnvFault("the served environment went away")

            def state(self) -> Any:
                raise RuntimeError("no state")

            def freeze(self) -> None:
                pass

        s.slots[0].env = Faulty()  # type: ignore[assignment]
        status, _, body = exchange(s.port, request("POST", s.path(rest="env/step"), b'{"action": "Up"}', key))
        assert status == 500 and "went away" in error(body)["message"]
        status, _, body = exchange(s.port, request("GET", s.path(rest="env"), b"", key))
        assert status == 500 and "no state" in error(body)["message"]
        status, _, body = exchange(s.port, request("GET", s.path(1, "v1/models"), b"", {"Authorization": s.key(1)}))
        assert status == 200 and json.loads(body)["data"][0]["id"] == "m"


def test_methods_routes_and_keys_get_json_errors():
    with Served(2) as s:
        for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
            status, _, body = exchange(s.port, request(method, s.path(), CHAT, {"Authorization": s.key()}))
            assert status == 405 and error(body)["code"] == "method_not_allowed", method
        status, _, body = exchange(s.port, request("HEAD", s.path(rest="v1/models")))
        assert status == 405 and body == b""
        status, _, body = exchange(s.port, request("BREW", s.path(), CHAT))
        assert status in (405, 501) and error(body)
        status, _, body = exchange(s.port, b"GET /x HTTP/one\r\n\r\n")
        assert status == 400 and error(body)
        # no key, another episode's key, a made-up episode
        status, _, body = exchange(s.port, request("POST", s.path(0), CHAT))
        assert status == 401 and error(body)["code"] == "invalid_api_key"
        status, _, body = exchange(s.port, request("POST", s.path(0), CHAT, {"Authorization": s.key(1)}))
        assert status == 401
        status, _, body = exchange(s.port, request("POST", "/e/deadbeef/v1/chat/completions", CHAT))
        assert status == 404 and error(body)["code"] == "not_found"
        status, _, body = exchange(s.port, request("GET", s.path(1, "v1/models"), b"", {"Authorization": s.key(1)}))
        assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
        # issue 93: the path's token is not the key, and the environment's routes want the key too
        path_token = {"Authorization": f"Bearer {s.slots[0].token}"}
        status, _, body = exchange(s.port, request("POST", s.path(0), CHAT, path_token))
        assert status == 401 and s.slots[0].key != s.slots[0].token
        for method, rest in (("GET", "env"), ("POST", "env/step")):
            status, _, body = exchange(s.port, request(method, s.path(0, rest), b'{"action": "Up"}'))
            assert status == 401 and error(body)["code"] == "invalid_api_key", rest


def test_a_command_program_inherits_no_credential_of_the_run(monkeypatch):
    """Issue 93: a command got the whole environment (cloud keys, tracking tokens)."""
    from stages.endpoint import programs

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-pass")
    monkeypatch.setenv("WANDB_API_KEY", "do-not-pass")
    seen: dict[str, str] = {}

    class Popen:
        def __init__(self, args: Any, env: dict[str, str], **kw: Any) -> None:
            seen.update(env)
            self.returncode = 0

        def communicate(self) -> tuple[str, str]:
            return "", ""

    monkeypatch.setattr(programs.subprocess, "Popen", Popen)
    task = programs.AgentTask(base_url="u", api_key="k", model="m", env=None, env_name="e", options={}, seed=0,
                              split="train", group=0, sample=0)  # type: ignore[arg-type]  # fmt: skip
    thread, _ = programs.run_command(("prog",), task, programs.Outcome(), lambda: None)
    thread.join(5)
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "WANDB_API_KEY" not in seen
    assert seen["OPENAI_API_KEY"] == "k" and "PATH" in seen


def test_an_idle_or_slow_connection_is_closed_and_frees_its_thread(monkeypatch):
    monkeypatch.setattr(server._Handler, "timeout", 0.5)
    with Served(1) as s:
        before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(8)]
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(request("POST", s.path(), b"", {"Authorization": s.key(), "Content-Length": "100"}) + b"{")
        time.sleep(0.3)
        assert threading.active_count() > before
        for sock in [*idle, slow]:
            sock.settimeout(5)
            assert sock.recv(100) == b"", "the server closed the connection"
            sock.close()
        deadline = time.monotonic() + 5
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= before


def test_a_burst_of_connections_and_concurrent_calls_is_answered_every_one():
    with Served(4) as s:
        assert s.endpoint.server.request_queue_size >= server.MIN_BACKLOG
        # 300 connections opened at once, before any request: none is refused or dropped
        socks = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(300)]
        for sock in socks:
            sock.sendall(request("GET", s.path(0, "v1/models"), b"", {"Authorization": s.key(0)}))
        assert all(sock.recv(12).startswith(b"HTTP/1.1 200") for sock in socks)
        for sock in socks:
            sock.close()

    with Served(4, timeout=1.0) as s:
        # 64 simultaneous calls over 4 episodes: each answered, 200, a 409 conflict (one call at a time
        # per episode) or, once an episode's program has sat idle past its 1 s, a 400 (its episode ended)
        def call(k: int) -> tuple[int, float]:
            started = time.monotonic()
            status, _, _ = exchange(s.port, request("POST", s.path(k % 4), CHAT, {"Authorization": s.key(k % 4)}))
            return status, time.monotonic() - started

        with ThreadPoolExecutor(64) as pool:
            got = list(pool.map(call, range(64)))
        assert {status for status, _ in got} <= {200, 400, 409}
        assert sum(status == 200 for status, _ in got) >= 4
        assert max(seconds for _, seconds in got) < 5


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    return qwen25_tokenizer(tools=True)


def test_a_hostile_request_costs_its_episode_never_the_batch(qwen_tokenizer, monkeypatch):
    render = Template.render

    def picky(self: Template, messages: Any, tools: Any, generation: bool) -> str:
        if any(m.get("content") == "refuse me" for m in messages):
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant")
        return render(self, messages, tools, generation)

    monkeypatch.setattr(Template, "render", picky)
    rows = play(Saying(qwen_tokenizer, "<answer>Left</answer>"), ProgramConfig(function=f"{PROGRAMS}:hostile"), [3], 7)
    reasons = {r["sample"]: r["end_reason"] for r in rows}
    expected = {
        0: "a malformed request: messages[0].content: not valid Unicode",
        1: "a malformed request: stop[0]: not valid Unicode",
        2: "a malformed request: messages: the chat cannot be rendered (ValueError: Conversation roles",
        3: "a malformed request: tools[0].function.parameters: expected a JSON Schema object",
        4: "a malformed request: messages[1].tool_call_id: 'call_9_9' answers no tool call",
    }
    for sample, start in expected.items():
        assert reasons[sample].startswith(f"{AGENT_FAULT}: {start}"), reasons[sample]
    for sample in (5, 6):
        assert not reasons[sample].startswith(AGENT_FAULT) and rows[sample]["num_turns"] == 1


class Failing:
    """An engine that fails at its first generate call."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        raise RuntimeError("the engine fell over")


def _children() -> set[int]:
    mine = str(os.getpid())
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == mine and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def test_a_failed_batch_leaves_no_thread_and_no_program_behind(qwen_tokenizer, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("STUBBORN_PID", str(pids))
    before_threads, before_children = set(threading.enumerate()), _children()
    command = ProgramConfig(command=(*python_command(PROGRAMS), "stubborn"), timeout=60, pass_env=("STUBBORN_PID",))
    with pytest.raises(RuntimeError, match="fell over"):
        play(Failing(qwen_tokenizer), command, [1], 4)
    assert len(pids.read_text().split()) == 4, "the four commands had started"
    for pid in map(int, pids.read_text().split()):
        assert pid not in _children(), "a command was left running"
    assert _children() <= before_children
    with pytest.raises(RuntimeError, match="fell over"):
        play(Failing(qwen_tokenizer), ProgramConfig(function=f"{PROGRAMS}:forgetful"), [1], 4)
    left = [t for t in set(threading.enumerate()) - before_threads if t.is_alive()]
    assert not left, f"threads left behind: {[t.name for t in left]}"


def test_stop_at_answer_does_not_cut_an_agent_programs_responses():
    program = ProgramConfig(function=f"{PROGRAMS}:forgetful")
    assert AgentConfig(stop_at_answer=True, program=program).stop() == ()
    assert AgentConfig(stop_at_answer=True).stop() == ("</answer>",)


def test_a_revision_of_the_program_is_in_the_key_and_the_run_name_is_not():
    from catalog.keys import canonical_json

    def key(**kwargs: str) -> str:
        return canonical_json(AgentConfig(program=ProgramConfig(function=f"{PROGRAMS}:forgetful", **kwargs)))

    assert key() == key(model="other") and key() != key(revision="2")
    assert key(revision="2") == key(revision="2") != key(revision="3")
    assert "program_revision" not in key(), "a program without a revision keeps the keys it had"


def test_a_trickling_client_is_closed_at_the_request_deadline(monkeypatch):
    """Issue 93: the idle timeout is per read, so a byte every 29 s held a thread for
    ever. A request now has an overall deadline from the wait for it to its last byte,
    told in OpenAI's error shape (408)."""
    import select

    monkeypatch.setattr(server._Handler, "timeout", 0.8)
    monkeypatch.setattr(server, "REQUEST_DEADLINE", 1.5)
    with Served(1) as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        raw = request("POST", s.path(), CHAT, {"Authorization": s.key()})
        started, sent = time.monotonic(), 0
        while sent < len(raw) and not select.select([sock], [], [], 0.4)[0]:  # a byte each 0.4 s
            sock.sendall(raw[sent : sent + 1])
            sent += 1
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer
        assert time.monotonic() - started < 8 and sent < len(raw)
        sock.close()
        status, _, _ = exchange(s.port, raw)  # and the server goes on answering
        assert status == 200


def _answer(sock: socket.socket) -> bytes:
    """One whole answer read from `sock` (its head, and its body to its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0)
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def test_connections_past_the_cap_close_the_idle_ones_or_wait_their_turn(monkeypatch):
    """Issue 93: one thread per connection with no cap. Past the cap the answered
    connection idle longest is closed to make room; with none such, a new connection
    waits in the listen queue until the request deadline frees a place."""
    models = lambda s: request("GET", s.path(0, "v1/models"), b"", {"Authorization": s.key(0)})  # noqa: E731
    with Served(4) as s:
        s.endpoint.server.cap = 4
        kept = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(4)]
        for sock in kept[:2]:  # two answered and kept alive, two that never send
            sock.sendall(models(s))
            assert _answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)
        status, _, _ = exchange(s.port, models(s))
        assert status == 200
        assert kept[0].recv(100) == b"", "the answered connection idle longest made room"
        for _ in range(100):  # the closed connection's thread ends a moment later
            if len(s.endpoint.server.open) <= 4:
                break
            time.sleep(0.05)
        assert len(s.endpoint.server.open) <= 4
        for sock in kept:
            sock.close()
    monkeypatch.setattr(server, "REQUEST_DEADLINE", 1.0)
    with Served(4) as s:
        s.endpoint.server.cap = 4
        silent = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(4)]
        started = time.monotonic()
        status, _, _ = exchange(s.port, models(s))
        assert status == 200 and 0.8 < time.monotonic() - started < 8, "it waited for the deadline to free a place"
        assert all(_answer(sock).startswith(b"HTTP/1.1 408") for sock in silent)
        for sock in silent:
            sock.close()
