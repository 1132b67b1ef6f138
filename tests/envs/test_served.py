"""A served environment on loopback behaves like the local one; failures are clear."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import envs
from envs.base import EnvError
from envs.served import EnvServer


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
        envs.make("served", url=f"http://127.0.0.1:{httpd.server_address[1]}", env="bandit", timeout=0.5)
    assert time.time() - t0 < 2.5
    thread.join(5)
    httpd.server_close()


def test_a_spec_gives_a_served_env_its_own_options(server):
    from pipelines.load import load_spec

    options = f"{{url: {server.url}, env: frozenlake, options: {{slippery: false, render: relative}}}}"
    spec = load_spec("rollout.yaml", ["rollout.env=served", f"rollout.env_options={options}"])
    rollout = next(n for n in spec.nodes if n.name == "rollout")
    assert rollout.config.env_options["options"] == {"slippery": False, "render": "relative"}
    remote = envs.make("served", **rollout.config.env_options)
    assert remote.reset(3) == envs.make("frozenlake", slippery=False, render="relative").reset(3)
    remote.close()
