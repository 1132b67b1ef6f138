"""`stages.lost_nodes.watched` without a cluster: Ray's answers are stubbed (the cluster
tests, tests/pipelines/run/test_cluster.py, lose real nodes)."""

from __future__ import annotations

import threading
import time

import pytest

from stages import lost_nodes
from stages.lost_nodes import NodesLost, watched


@pytest.fixture
def cluster(monkeypatch):
    """What the stubbed cluster says: its dead nodes and its CPUs."""
    state = {"dead": {}, "cpus": 4.0}
    lost_nodes._nodes().close()  # when each node was first seen dead: this test's own
    monkeypatch.setattr(lost_nodes, "_dead", lambda: dict(state["dead"]))
    monkeypatch.setattr(
        lost_nodes,
        "short_of",
        lambda need: {r: (state["cpus"], n) for r, n in need.items() if r == "CPU" and state["cpus"] < n},
    )
    monkeypatch.setenv(lost_nodes.WAIT_ENV, "0.3")
    return state


def test_a_call_gives_its_result_or_its_error(cluster):
    assert watched(lambda: 7, {"CPU": 2}, "x", poll=0.01) == 7

    def fails() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        watched(fails, {"CPU": 2}, "x", poll=0.01)


def test_a_lost_node_that_leaves_too_few_cpus_fails_the_call_after_the_wait(cluster):
    cluster["dead"], cluster["cpus"] = {"0123456789abcdef": "10.0.0.7"}, 0.0
    stuck = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(NodesLost) as caught:
        watched(stuck.wait, {"CPU": 2}, "2 engine actor(s)", poll=0.01)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert str(caught.value) == (
        "2 engine actor(s): node(s) 0123456789ab (10.0.0.7) lost, and the nodes left have 0 of the 2 CPU it needs; "
        "waited 0.3 s ($PIPELINE_NODE_WAIT_SECONDS); start the node(s) again and run the same command to resume"
    )
    stuck.set()


def test_a_short_cluster_without_a_lost_node_or_a_lost_node_with_room_left_waits(cluster):
    """Too few CPUs with no node lost (Ray's own queueing, e.g. another run's actors), or
    a node lost with enough left (Ray restarts what it held there): the call goes on."""
    for dead, cpus in (({}, 0.0), ({"n": "a"}, 4.0)):
        cluster["dead"], cluster["cpus"] = dead, cpus
        done = threading.Event()
        threading.Timer(0.8, done.set).start()  # longer than the wait
        assert watched(lambda: done.wait() and "done", {"CPU": 2}, "x", poll=0.01) == "done"


def test_the_wait_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(lost_nodes.WAIT_ENV, "7.5")
    assert lost_nodes.wait_seconds() == 7.5
    monkeypatch.setenv(lost_nodes.WAIT_ENV, "soon")
    assert lost_nodes.wait_seconds() == lost_nodes.DEFAULT_WAIT


def test_only_the_nodes_lost_since_the_run_joined_the_cluster_count(monkeypatch):
    """A long-lived cluster lists every node it ever lost: those lost before this run's
    session began are not its losses (a wait for capacity would fail on them at once)."""
    import ray

    nodes = [{"NodeID": "old", "Alive": False, "NodeManagerAddress": "10.0.0.1"}, {"NodeID": "up", "Alive": True}]
    monkeypatch.setattr(ray, "nodes", lambda: list(nodes))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    lost_nodes._nodes().before.clear()
    assert lost_nodes._dead() == {"old": "10.0.0.1"}  # no session noted: every dead node counts
    lost_nodes.note_session()
    assert lost_nodes._dead() == {}
    nodes.append({"NodeID": "new", "Alive": False, "NodeManagerAddress": "10.0.0.2"})
    assert lost_nodes._dead() == {"new": "10.0.0.2"}


def test_a_call_given_up_on_is_stopped_before_the_error(cluster):
    """NodesLost comes after `stop` has ended the call's work and its thread: nothing of
    it still runs on the folders and placement group the caller then removes."""
    stopped, ended = threading.Event(), threading.Event()

    def call() -> None:
        stopped.wait(30)
        time.sleep(0.2)  # winding down
        ended.set()

    cluster["dead"], cluster["cpus"] = {"n1": "10.0.0.2"}, 1.0
    with pytest.raises(NodesLost):
        watched(call, {"CPU": 2}, "2 Ray Train worker(s)", poll=0.01, stop=stopped.set)
    assert stopped.is_set() and ended.is_set()
    assert not any(t.name == "watched 2 Ray Train worker(s)" for t in threading.enumerate())


def test_a_node_lost_long_before_the_call_does_not_fail_its_wait_for_capacity(cluster):
    """An autoscaling cluster scaled a node down an hour ago: a call that then waits for
    CPUs past the wait is waiting, not lost."""
    lost_nodes._nodes().seen["n-old"] = time.monotonic() - 3600
    cluster["dead"], cluster["cpus"] = {"n-old": "10.0.0.9"}, 1.0
    assert watched(lambda: time.sleep(1.0) or 5, {"CPU": 2}, "x", poll=0.01) == 5  # past the 0.3 s wait
    cluster["dead"]["n-new"] = "10.0.0.3"  # one lost during the call counts
    with pytest.raises(NodesLost, match="n-new"):
        watched(lambda: time.sleep(5), {"CPU": 2}, "x", poll=0.01)


class _Calls:
    """A stand-in for an actor call: `submit` makes a ref; `ray.get` of the first
    `unavailable` refs raises ActorUnavailableError (the actor's node lost, not yet dead)."""

    def __init__(self, unavailable: int, then: BaseException | None = None) -> None:
        self.made, self.unavailable, self.then = 0, unavailable, then

    def submit(self) -> int:
        self.made += 1
        return self.made

    def get(self, ref: int) -> str:
        from ray.exceptions import ActorUnavailableError

        if ref <= self.unavailable:
            raise ActorUnavailableError("connection refused", None)
        if self.then is not None:
            raise self.then
        return f"answer {ref}"


def test_a_call_that_cannot_reach_its_actor_is_made_again_until_it_is_answered(monkeypatch):
    import ray

    calls = _Calls(unavailable=3)
    monkeypatch.setattr(ray, "get", calls.get)
    assert lost_nodes.patient(calls.submit, idle=0.01) == "answer 4"
    assert calls.made == 4


def test_an_actor_ray_gave_up_on_fails_the_call_at_once(monkeypatch):
    import ray
    from ray.exceptions import ActorDiedError

    calls = _Calls(unavailable=1, then=ActorDiedError())
    monkeypatch.setattr(ray, "get", calls.get)
    with pytest.raises(ActorDiedError):
        lost_nodes.patient(calls.submit, idle=0.01)
    assert calls.made == 2


def test_an_actor_never_reached_fails_the_call_after_the_wait(monkeypatch):
    import ray
    from ray.exceptions import ActorUnavailableError

    calls = _Calls(unavailable=10**9)
    monkeypatch.setattr(ray, "get", calls.get)
    monkeypatch.setenv(lost_nodes.WAIT_ENV, "0.2")
    t0 = time.monotonic()
    with pytest.raises(ActorUnavailableError):
        lost_nodes.patient(calls.submit, idle=0.01)
    assert 0.2 <= time.monotonic() - t0 < 5 and calls.made > 5
