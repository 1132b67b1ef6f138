"""A run's live state has one owner (`common.live`): what a run holds in memory — its
trainer, the weights it published, its engine host, what it learnt of env servers — is
made in the run's `Live` and closed when the run ends, on success, on error and on
interrupt; two runs in one process share nothing, and no thread the run started stays."""

from __future__ import annotations

import threading

import pytest

from catalog.store import Catalog
from common import live
from common.errors import StageFailed
from envs import served
from pipelines.graph.load import load_spec
from pipelines.run.runner import Runner
from tests.stages.conftest import TINY_GRPO


class Thing:
    def __init__(self, log: list[str], name: str, fail: bool = False) -> None:
        self.log, self.name, self.fail = log, name, fail

    def close(self) -> None:
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} would not close")


def test_a_scope_closes_its_slots_newest_first_even_when_one_fails():
    log: list[str] = []
    with pytest.raises(RuntimeError, match="a would not close"), live.scope("r") as owner:
        assert live.current() is owner
        live.slot("a", lambda: Thing(log, "a", fail=True))
        assert live.slot("a", lambda: Thing(log, "again")).name == "a"  # made once
        live.slot("b", lambda: Thing(log, "b"))
    assert log == ["b", "a"] and live.current() is not owner and owner.slots == {}


def test_what_is_held_outside_a_run_is_closed_when_a_run_starts():
    log: list[str] = []
    live.slot("before", lambda: Thing(log, "before"))
    with live.scope("r"):
        assert log == ["before"]
        assert live.held() == {}


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


def _run(tmp_path, catalog: Catalog, *overrides: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY_GRPO)
    Runner(load_spec(str(spec), overrides), catalog).run()


def test_two_runs_in_one_process_share_nothing_and_leave_no_thread(tmp_path, monkeypatch):
    from stages.training import resident

    live.close_ambient()
    served._health("http://127.0.0.1:1").failed = 9  # a server that "another run" took for down
    before = _threads()
    catalog = Catalog(str(tmp_path / "catalog"))
    seen: list[dict[str, list[str]]] = []
    apply = resident.Trainer.apply

    def watched(self, *args, **kwargs):  # what the run holds while it trains
        seen.append(live.held())
        return apply(self, *args, **kwargs)

    monkeypatch.setattr(resident.Trainer, "apply", watched)
    _run(tmp_path, catalog)
    (owner,) = seen[-1]
    assert owner != "ambient" and {"resident trainer", "engine host"} <= set(seen[-1][owner])
    assert live.held() == {}, "the run's trainer, weights and engine host were closed with it"
    assert served._health("http://127.0.0.1:1").failed == 0, "a new owner: nothing learnt before it"
    live.close_ambient()
    _run(tmp_path, catalog, "run.seed=4")
    assert live.held() == {}
    left = _threads() - before
    assert not left, f"threads left by the runs: {[t.name for t in left]}"


@pytest.mark.parametrize("how", ["error", "interrupt"])
def test_a_run_that_fails_or_is_interrupted_closes_what_it_held(tmp_path, monkeypatch, how):
    from stages.training import resident

    live.close_ambient()
    before = _threads()
    held_then: list[dict[str, list[str]]] = []
    apply = resident.Trainer.apply

    def failing(self, *args, **kwargs):
        apply(self, *args, **kwargs)
        held_then.append(live.held())
        raise KeyboardInterrupt if how == "interrupt" else RuntimeError("the update fell over")

    monkeypatch.setattr(resident.Trainer, "apply", failing)
    with pytest.raises((KeyboardInterrupt, StageFailed)):
        _run(tmp_path, Catalog(str(tmp_path / "catalog")))
    assert held_then and any("resident trainer" in slots for slots in held_then[0].values())
    assert live.held() == {}
    left = _threads() - before
    assert not left, f"threads left by the run: {[t.name for t in left]}"


@pytest.mark.parametrize("stage_fails", [False, True])
def test_a_slot_that_fails_to_close_neither_hides_the_stages_error_nor_leaves_the_run_unended(
    tmp_path, monkeypatch, stage_fails
):
    """Issue 93: an error closing a slot replaced the stage's own exception, and on success
    skipped the run record's end. Now the stage's error is the one raised (the closing
    error is said beside it), and a run that succeeded ends, failed, with the closing error."""
    from catalog.query import query
    from stages.training import resident

    live.close_ambient()
    apply = resident.Trainer.apply

    def holds_a_bad_slot(self, *args, **kwargs):
        out = apply(self, *args, **kwargs)
        live.slot("bad slot", lambda: Thing([], "bad slot", fail=True))
        if stage_fails:
            raise RuntimeError("the update fell over")
        return out

    monkeypatch.setattr(resident.Trainer, "apply", holds_a_bad_slot)
    catalog = Catalog(str(tmp_path / "catalog"))
    with pytest.raises((StageFailed, RuntimeError)) as raised:
        _run(tmp_path, catalog)
    if stage_fails:
        assert "the update fell over" in str(raised.value) and "would not close" not in str(raised.value)
    else:
        assert "bad slot would not close" in str(raised.value)
    assert query(catalog, "select status from runs").column("status").to_pylist() == ["failed"]


def test_two_runs_under_one_kept_ray_session_share_no_engine_actor_nor_lost_node(tmp_path, monkeypatch, ray_session):
    """Issue 93: the engine actors outlived their run under ``PIPELINE_KEEP_RAY`` (the next
    run reused them, their engine and weights); a run in a kept Ray session never noted the
    nodes dead before it, so they counted as its losses; a thread that outlived its run made
    its state in the next run's owner. Now each run's actors end with it, each run notes
    the session at its first use of Ray, and a straggler finds its own run ended."""
    import ray

    from stages import lost_nodes
    from stages.engines import hosts
    from stages.training import resident

    live.close_ambient()
    dead = {"NodeID": "n-lost-long-ago", "Alive": False, "NodeManagerAddress": "10.0.0.9"}
    nodes = ray.nodes
    monkeypatch.setattr(ray, "nodes", lambda: [*nodes(), dead])
    catalog = Catalog(str(tmp_path / "catalog"))
    actors: list[list[object]] = []
    before: list[set[str]] = []
    straggler = threading.Event()
    outcome: list[object] = []
    apply = resident.Trainer.apply

    def watched(self, *args, **kwargs):
        actors.append([h for pool in hosts._pools().values() for h in pool.hosts])
        before.append(set(lost_nodes._nodes().before))
        if len(actors) == 1:  # a thread of the first run that outlives it

            def late() -> None:
                straggler.wait(60)
                try:
                    live.slot("late", lambda: Thing([], "late"))
                    outcome.append(live.held())
                except live.Ended as exc:
                    outcome.append(exc)

            live.thread(late, "straggler").start()
        return apply(self, *args, **kwargs)

    monkeypatch.setattr(resident.Trainer, "apply", watched)
    _run(tmp_path, catalog, "rollout.actors=1", "run.iterations=1")
    first = actors[0]
    assert first and live.held() == {}
    with pytest.raises(ray.exceptions.RayActorError):  # killed with its run, though Ray goes on
        ray.get(first[0].where.remote(), timeout=30)
    with live.scope("next run") as owner:
        straggler.set()
        for _ in range(600):
            if outcome:
                break
            threading.Event().wait(0.05)
        assert "late" not in owner.slots
    (said,) = outcome
    assert isinstance(said, live.Ended), said
    _run(tmp_path, catalog, "rollout.actors=1", "run.iterations=1", "run.seed=4")
    assert actors[-1] and not set(actors[-1]) & set(first), "the second run built its own actors"
    assert all("n-lost-long-ago" in b for b in before), "each run noted the nodes dead before it"
    assert live.held() == {}
