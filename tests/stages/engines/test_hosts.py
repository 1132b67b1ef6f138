"""Engine hosts: built once, weights loaded each iteration, restarted when killed."""

import os
import signal
from dataclasses import asdict

import pyarrow as pa
import pytest
import ray

from common import live
from stages.agent.loop import AgentConfig
from stages.agent.play import PlayJob, episode_specs, play_batch
from stages.engines import EngineSettings, SamplingParams, hosts
from tests.conftest import ACROSS_PROCESSES, run_spec
from tests.stages.conftest import TINY_GRPO

AGENT = AgentConfig(max_turns=2, max_new_tokens=8)
JOB = PlayJob(AGENT, SamplingParams(max_new_tokens=8), 11)
HF = EngineSettings("hf", actors=1)


def metric_sum(catalog, prefix: str, name: str) -> float:
    return sum(catalog.manifest(k)["metrics"].get(name, 0) for k in catalog.result_keys() if k.startswith(prefix))


def test_a_run_builds_each_engine_once_and_loads_every_new_policy(spec_file, catalog):
    spec = TINY_GRPO.replace("iterations: 2", "iterations: 4").replace("actors: 0", "actors: 1")
    run_spec(spec_file(spec), catalog)
    assert metric_sum(catalog, "rollout-", "perf/engine_builds") == 1
    # policies v1, v2, v3, from the trainer's memory through the object store; no checkpoint read
    assert metric_sum(catalog, "rollout-", "perf/memory_weight_loads") == 3
    assert metric_sum(catalog, "rollout-", "perf/weight_loads") == 0


def test_in_process_hosts_count_the_same_way(spec_file, catalog):
    live.close_ambient()  # no engine left by an earlier test
    run_spec(spec_file(TINY_GRPO.replace("iterations: 2", "iterations: 3")), catalog)
    assert metric_sum(catalog, "rollout-", "perf/engine_builds") == 1
    assert metric_sum(catalog, "rollout-", "perf/memory_weight_loads") == 2
    assert metric_sum(catalog, "rollout-", "perf/weight_loads") == 0


def items(n: int = 8) -> pa.Table:
    return pa.Table.from_pylist([asdict(s) for s in episode_specs("sokoban", None, [3, 4], n // 2)])


@ACROSS_PROCESSES
def test_a_host_killed_between_calls_is_restarted(shared_ray, tiny_policy):
    first, counts = hosts.play_on_ray(items(), tiny_policy, play_batch, JOB, HF)
    assert counts["perf/engine_builds"] == 1 and counts["perf/weight_loads"] == 0
    seconds = [counts[f"perf/{k}_seconds"] for k in ("generate", "load", "play")]
    assert 0 < seconds[0] < seconds[2] and 0 < seconds[1] < seconds[2]
    (host,) = hosts.ray_pool("hf", 1, None, 0.0)
    os.kill(ray.get(host.pid.remote()), signal.SIGKILL)
    again, counts = hosts.play_on_ray(items(), tiny_policy, play_batch, JOB, HF)
    assert again.equals(first) and counts["perf/engine_restarts"] == 1
    assert counts["perf/engine_builds"] == 1  # the restarted process built its engine anew


@ACROSS_PROCESSES
def test_a_host_killed_inside_a_call_replays_the_batch(shared_ray, tiny_policy, tmp_path):
    expected, _ = hosts.play_on_ray(items(), tiny_policy, play_batch, JOB, HF)
    marker = tmp_path / "die-once"
    marker.touch()

    def dies_once(engine, rows, job):
        if marker.exists():
            marker.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return play_batch(engine, rows, job)

    table, counts = hosts.play_on_ray(items(), tiny_policy, dies_once, JOB, HF)
    assert not marker.exists() and table.equals(expected)
    assert counts["perf/engine_restarts"] == 1  # said as a warning and an events row by the stage


def test_a_host_that_stays_dead_fails_the_call_instead_of_hanging(shared_ray, tiny_policy, monkeypatch):
    monkeypatch.setattr(hosts, "RESTARTS", 0)

    def dies(engine, rows, job):
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(RuntimeError, match="an engine actor failed"):
        hosts.play_on_ray(items(), tiny_policy, dies, JOB, HF)
    assert not hosts._pools()  # the next call starts a new pool
    table, _ = hosts.play_on_ray(items(), tiny_policy, play_batch, JOB, HF)
    assert table.num_rows == 8


def test_reserving_every_cpu_is_refused(shared_ray, tiny_policy):
    from common.errors import UserError

    with pytest.raises(UserError, match="leave none of the cluster's 2 CPUs"):
        hosts.play_on_ray(items(), tiny_policy, play_batch, JOB, EngineSettings("hf", actors=1, actor_cpus=2.0))


def test_a_new_checkpoint_of_the_same_model_is_loaded_not_built(shared_ray, tiny_policy, tmp_path):
    import torch

    from stages.models.policy import load_policy, save_policy

    model, tokenizer = load_policy(tiny_policy)
    base, other = tmp_path / "base", tmp_path / "other"
    save_policy(model, tokenizer, base, version=0)  # saved as every stage saves a loaded policy
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    save_policy(model, tokenizer, other, version=1)
    first, _ = hosts.play_on_ray(items(), base, play_batch, JOB, HF)
    second, counts = hosts.play_on_ray(items(), other, play_batch, JOB, HF)
    assert counts["perf/engine_builds"] == 0 and counts["perf/weight_loads"] == 1
    assert second["token_ids"].to_pylist() != first["token_ids"].to_pylist()  # the new weights sample
    fresh = hosts.EngineHost("hf", threads=2).run(other, play_batch, items(), JOB)  # the actor's: 2 CPUs, 1 actor
    assert second.equals(fresh)  # what a new engine built from that checkpoint samples


@ACROSS_PROCESSES
def test_an_engine_actor_killed_inside_a_runs_rollout_leaves_the_run_as_if_undisturbed(
    spec_file, catalog, tmp_path, monkeypatch, shared_ray
):
    """A pipeline run whose engine actor is SIGKILLed in the middle of its second
    rollout: Ray restarts the actor, the batch is played again from the same seeds, the
    run finishes with the trajectories and final policy of an undisturbed run, and the
    restart is a row of the run's events."""
    import hashlib

    from catalog.query import query
    from catalog.store import Catalog
    from stages.agent import play

    spec = spec_file(TINY_GRPO.replace("iterations: 2", "iterations: 3").replace("actors: 0", "actors: 1"))
    undisturbed = Catalog(str(tmp_path / "undisturbed"))
    try:
        run_spec(spec, undisturbed)  # both runs in the module's Ray session
    finally:
        hosts.drop_pool()
    marker = tmp_path / "die-in-the-second-rollout"
    marker.write_text("2")
    real = play.play_batch

    def dies_once(engine, rows, job, on_done=None):  # pickled by value into the actor
        left = int(marker.read_text()) if marker.exists() else 0
        if left == 1:
            marker.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        if left > 1:
            marker.write_text(str(left - 1))
        return real(engine, rows, job, on_done)

    monkeypatch.setattr(play, "play_batch", dies_once)
    run_spec(spec, catalog)
    assert not marker.exists()  # the actor did die, in the second rollout

    def outputs(c: Catalog) -> dict[str, str]:
        """Every result's output files (not its timing metrics) by key."""
        out = {}
        for key in c.result_keys():
            files = c.manifest(key)["files"]
            out[key] = hashlib.sha256(
                repr(sorted((n, f["sha256"]) for n, f in files.items() if n != "metrics.parquet")).encode()
            ).hexdigest()
        return out

    assert outputs(catalog) == outputs(undisturbed)  # trajectories, batches, policies: byte for byte
    (row,) = query(catalog, "select iteration, rule, metric, value from events").to_pylist()
    assert row == {"iteration": 1, "rule": "rollout", "metric": "perf/engine_restarts", "value": 1.0}


def test_the_node_label_is_ray_s_own() -> None:
    """`play_on_ray` places its `forward` tasks by the label every node has with its id."""
    import ray._raylet

    from stages.engines.hosts import NODE_LABEL

    assert getattr(ray._raylet, "RAY_NODE_ID_KEY", NODE_LABEL) == NODE_LABEL


def test_a_switch_of_engine_settings_keeps_each_pool(shared_ray):
    """A rollout and an eval of other settings (vLLM and hf, say) each keep their pool
    for the session: a switch back builds nothing (before, each switch dropped the
    other pool and built its own again)."""
    first = hosts.ray_pool("hf", 1, None, 0.0)
    other = hosts.ray_pool("hf", 2, None, 0.0)
    assert hosts.ray_pool("hf", 1, None, 0.0) == first and hosts.ray_pool("hf", 2, None, 0.0) == other
    assert len(hosts._pools()) == 2
    hosts.drop_pool()
    assert not hosts._pools()
