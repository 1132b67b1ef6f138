"""A served environment on loopback behaves like the local one; failures are clear."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import envs
from envs.base import EnvError, EnvFault
from envs.served import EnvServer, _Handler
from tests.stages.conftest import tiny_policy  # noqa: F401  (a fixture)


@pytest.fixture
def server():
    srv = EnvServer(port=0).start()
    yield srv
    srv.stop()


def test_round_trip_matches_local(server):
    remote = envs.make("served", url=server.url, env="sokoban", options={"num_boxes": 1})
    local = envs.make("sokoban")
    assert remote.reset(7) == local.reset(7)
    assert remote.action_words == local.action_words and remote.instructions == local.instructions
    assert remote.budget == local.budget
    for action in ["Up", "left", "nonsense", "Down", "Right", "Right"]:
        assert remote.step(action) == local.step(action)
    remote.close()


def test_server_side_errors_are_env_errors(server):
    with pytest.raises(EnvError, match=r"served env http://127\.0\.0\.1:\d+: unknown environment 'sokobn'"):
        envs.make("served", url=server.url, env="sokobn")


def test_dead_server_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EnvError, match=r"cannot reach the server"):
        envs.make("served", url=f"http://127.0.0.1:{port}", env="bandit", timeout=2)


def test_a_server_that_hangs_times_out():
    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            time.sleep(3)

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=httpd.handle_request, daemon=True)
    thread.start()
    t0 = time.time()
    with pytest.raises(EnvError, match=r"no answer within 0\.5 s"):
        envs.make("served", url=f"http://127.0.0.1:{httpd.server_address[1]}", env="bandit", timeout=0.5, retries=0)
    assert time.time() - t0 < 2.5
    thread.join(5)
    httpd.server_close()


def test_a_spec_gives_a_served_env_its_own_options(server):
    from pipelines.graph.load import load_spec

    options = f"{{url: {server.url}, env: frozenlake, options: {{slippery: false, render: relative}}}}"
    spec = load_spec("rollout.yaml", ["rollout.env=served", f"rollout.env_options={options}"])
    rollout = next(n for n in spec.nodes if n.name == "rollout")
    assert rollout.config.env_options["options"] == {"slippery": False, "render": "relative"}
    remote = envs.make("served", **rollout.config.env_options)
    assert remote.reset(3) == envs.make("frozenlake", slippery=False, render="relative").reset(3)
    remote.close()


class _Flaky(_Handler):
    """Every `every`-th request fails with `kind` (set on the server)."""

    def do_POST(self):
        srv = self.server
        srv.count += 1
        if srv.count % srv.every:
            return super().do_POST()
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if srv.kind == "drop":
            self.close_connection = True  # no answer at all: the client sees the connection end
            return
        if srv.kind == "slow":
            time.sleep(1.0)
        status, body = {"500": (500, b'{"error": "boom"}'), "json": (200, b"<html>"), "keys": (200, b"{}")}.get(
            srv.kind, (200, b"{}")
        )
        with contextlib.suppress(OSError):  # a slow answer's client is gone
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


def flaky_server(kind: str, every: int) -> EnvServer:
    srv = EnvServer(port=0)
    srv.httpd.RequestHandlerClass = _Flaky
    srv.httpd.kind, srv.httpd.every, srv.httpd.count = kind, every, 0
    return srv.start()


FAULTS = {
    "500": r"server error 500 \(boom\)",
    "slow": r"no answer within 0\.3 s",
    "drop": r"connection broke|cannot reach",
    "json": r"not JSON",
    "keys": r"lacks text",
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_a_fault_is_tried_again_where_it_can_be_and_is_an_env_fault_where_not(kind):
    srv = flaky_server(kind, every=2)
    try:
        remote = envs.make("served", url=srv.url, env="frozenlake", timeout=0.3)  # request 1
        local = envs.make("frozenlake")
        assert remote.reset(5) == local.reset(5)  # request 2 fails; the reset is tried again (3)
        with pytest.raises(EnvFault, match=FAULTS[kind]) as caught:
            remote.step("Left")  # request 4 fails: a step is never repeated
        assert srv.url in str(caught.value) and "\n" not in str(caught.value)
        remote.close()  # a failed close is no error
    finally:
        srv.stop()


def test_a_call_on_an_environment_the_server_lost_is_an_env_fault_not_a_spec_mistake(server):
    """A server restarted mid-episode answers 400 "no environment with id": the episode's
    environment failed (dropped and counted), not a mistake in the spec."""
    remote = envs.make("served", url=server.url, env="frozenlake")
    remote.reset(1)
    server.envs.clear()  # as after a restart
    with pytest.raises(EnvFault, match=r"/step: refused \(400: no environment with id"):
        remote.step("Left")
    with pytest.raises(EnvFault, match=r"/reset: refused \(400"):
        remote.reset(1)
    with pytest.raises(EnvError) as caught:  # a refused /create is still the spec's mistake
        envs.make("served", url=server.url, env="sokobn")
    assert not isinstance(caught.value, EnvFault)


def test_a_hung_server_is_given_up_on_after_a_few_calls_and_tried_again_later(monkeypatch):
    """Every episode's /create against a server that never answers would wait out its
    tries; after DOWN_AFTER calls that failed every try the rest fail at once, until
    DOWN_FOR has passed and one is tried again."""
    from envs import served

    monkeypatch.setattr(served, "DOWN_FOR", 1.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # accepts connections, never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        faults = []
        for _ in range(8):
            with pytest.raises(EnvFault) as caught:
                envs.make("served", url=url, env="bandit", timeout=0.3, retries=1)
            faults.append(str(caught.value))
        spent = time.monotonic() - t0
        tried = [f for f in faults[: served.DOWN_AFTER] if "not tried" not in f]
        assert len(tried) == served.DOWN_AFTER and all("no answer within 0.3 s" in f for f in tried), faults
        assert all("not tried, the server failed 2 calls in a row" in f for f in faults[served.DOWN_AFTER :])
        assert spent < served.DOWN_AFTER * (2 * 0.3 + 0.5) + 1.0  # not 8 episodes' tries
        time.sleep(1.6)
        t1 = time.monotonic()
        with pytest.raises(EnvFault) as caught:  # tried again
            envs.make("served", url=url, env="bandit", timeout=0.3, retries=0)
        assert "not tried" not in str(caught.value) and "no answer within 0.3 s" in str(caught.value)
        assert time.monotonic() - t1 >= 0.3
    finally:
        listener.close()


def test_environments_are_closed_on_the_server(server, tiny_policy):  # noqa: F811
    """The check at spec load and every played episode free their place on the server."""
    import pyarrow as pa

    from pipelines.graph.load import load_spec
    from stages.agent.loop import AgentConfig
    from stages.agent.play import PlayJob, episode_specs, play_batch
    from stages.engines import SamplingParams
    from stages.engines.hf import HFEngine

    options = {"url": server.url, "env": "frozenlake"}
    load_spec("rollout.yaml", ["rollout.env=served", f"rollout.env_options={json.dumps(options)}"])
    assert server.envs == {} and next(server.ids) >= 2  # it made one, and closed it
    specs = episode_specs("served", options, [1, 2], 2)
    job = PlayJob(AgentConfig(max_turns=2, max_new_tokens=8), SamplingParams(temperature=1.0, max_new_tokens=8), 0)
    table = play_batch(HFEngine(tiny_policy), pa.Table.from_pylist([asdict(s) for s in specs]), job)
    assert table.num_rows == 4 and server.envs == {}


def test_the_command_runs_as_its_package_main_without_warning():
    """`python -m envs.served` runs envs/served/__main__.py: not the module `envs` already
    imported a second time (runpy warned on every start)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "envs.served", "--protocol", "openenv", "--options", "[1]"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --options: a JSON object of the environment's options (not an object)"
    ]
