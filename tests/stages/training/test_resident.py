"""The run's resident trainer (`stages.training.resident`): the policy stays in memory
between checkpoints, its versions in between are committed as a digest and a recipe,
engines get weights without a catalog read, and a lost trainer is rebuilt exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from catalog.datasets import RESIDENT_FILE
from catalog.keys import from_canonical
from catalog.query import query
from catalog.store import Catalog
from common.errors import CatalogError
from stages.training import rebuild, resident
from tests.conftest import ACROSS_PROCESSES, run_spec
from tests.stages.conftest import TINY_GRPO

#: four iterations of the smallest learning pipeline, a checkpoint every second version
SPEC = TINY_GRPO.replace("run: {iterations: 2, seed: 3}", "run: {iterations: 4, seed: 3}").replace(
    "update: {optim:", "update: {checkpoint_every: 2, optim:"
)


def _updates(catalog: Catalog) -> list[str]:
    return [
        k
        for _, k in sorted(
            (catalog.manifest(k)["iteration"], k) for k in catalog.result_keys() if k.startswith("update-")
        )
    ]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def every_version(tmp_path_factory):
    """The same run with every version stored (`checkpoint_every: 1`): the same keys."""
    folder = tmp_path_factory.mktemp("every")
    (folder / "spec.yaml").write_text(SPEC.replace("checkpoint_every: 2", "checkpoint_every: 1"))
    catalog = Catalog(str(folder / "catalog"))
    run_spec(str(folder / "spec.yaml"), catalog)
    return catalog


@pytest.fixture(scope="module")
def every_second(tmp_path_factory):
    folder = tmp_path_factory.mktemp("second")
    (folder / "spec.yaml").write_text(SPEC)
    catalog = Catalog(str(folder / "catalog"))
    run_spec(str(folder / "spec.yaml"), catalog)
    return catalog


def test_versions_between_checkpoints_stay_in_memory_under_the_same_keys(every_second, every_version):
    assert _updates(every_second) == _updates(every_version)  # checkpoint_every is not part of a key
    rows = query(
        every_second, "select iteration, in_memory, bytes from results where stage = 'update' order by iteration"
    ).to_pylist()
    # versions 2 and 4 are stored (every second; 4 is the last), 1 and 3 stay in memory
    assert [(r["iteration"], r["in_memory"]) for r in rows] == [(0, True), (1, False), (2, True), (3, False)]
    assert all(r["bytes"] < 4_000 for r in rows if r["in_memory"])  # policy.json, resident.json, the metrics
    stored = [r["bytes"] for r in rows if not r["in_memory"]]
    assert min(stored) > 100 * max(r["bytes"] for r in rows if r["in_memory"])
    for key in _updates(every_second)[1::2]:  # the stored versions: the same bytes as when every version is stored
        assert _files(every_second.ref(key, "policy").local_path()) == _files(
            every_version.ref(key, "policy").local_path()
        )


def test_a_version_in_memory_is_rebuilt_exactly_when_its_files_are_read(every_second, every_version):
    resident.release()  # a later process: no trainer holds anything
    first = _updates(every_second)[0]
    ref = every_second.ref(first, "policy")
    assert ref.resident() is not None
    rebuilt = ref.local_path()  # replays update 0 from the warm start and its batch
    stored = every_version.ref(first, "policy").local_path()
    assert load_file(str(rebuilt / "model.safetensors")).keys() == load_file(str(stored / "model.safetensors")).keys()
    assert (rebuilt / "model.safetensors").read_bytes() == (stored / "model.safetensors").read_bytes()
    assert json.loads((rebuilt / "policy.json").read_text()) == json.loads((stored / "policy.json").read_text())


def _copy(catalog: Catalog, tmp_path: Path) -> Catalog:
    """A copy of `catalog` to tamper with, and no trainer held (a later process)."""
    import shutil

    resident.release()
    shutil.copytree(catalog.root.path(), tmp_path / "copy", ignore=shutil.ignore_patterns("_staging"))
    return Catalog(str(tmp_path / "copy"))


def test_a_rebuild_that_does_not_reach_the_recorded_weights_fails_in_one_line(every_second, tmp_path):
    """A reader that cannot reproduce a version changes nothing; the run that made it,
    replaying it on its own machine, marks it damaged, and its next invocation computes it
    anew."""
    from common import live

    catalog = _copy(every_second, tmp_path)
    first = _updates(catalog)[0]
    path = Path(catalog.root.path("results", first, "policy", RESIDENT_FILE))
    info = json.loads(path.read_text())
    path.write_text(json.dumps({**info, "rebuild": {**info["rebuild"], "seed": info["rebuild"]["seed"] + 1}}))
    with pytest.raises(CatalogError, match="rebuilt weights differ from those the run recorded") as read:
        catalog.ref(first, "policy").local_path()  # a reader: this process is no run
    assert "nothing is marked" in str(read.value) and "\n" not in str(read.value)
    assert not any(catalog.damage_mark(k) for k in _updates(catalog))
    resident.release()
    with live.scope(info["rebuild"]["run"]), pytest.raises(CatalogError, match="marked damaged") as failed:
        catalog.ref(first, "policy").local_path()  # the run that made it
    assert "\n" not in str(failed.value)
    # version 1 is marked; versions 3 (resident, rebuilt from the stored version 2) and 2 and 4 are not
    assert catalog.damage_mark(first) and "the 0 version(s) made from it" in str(failed.value)
    assert not any(catalog.damage_mark(k) for k in _updates(catalog)[1:])
    # the advice works: the run again computes the damaged updates anew, and every version reads
    resident.release()
    (tmp_path / "spec.yaml").write_text(SPEC)
    run_spec(str(tmp_path / "spec.yaml"), catalog)
    resident.release()
    assert catalog.damage_mark(first) is None
    assert (catalog.ref(first, "policy").local_path() / "model.safetensors").is_file()


def test_a_version_read_on_another_kind_of_machine_says_what_differs_and_marks_nothing(every_second, tmp_path):
    """The adversary of issue 93: a shared catalog read from a node whose kernels differ.
    Emulated by the recipe's machine record; the replay misses (a changed seed stands
    for other floats), and the one line names the difference."""
    from common import live

    catalog = _copy(every_second, tmp_path)
    first = _updates(catalog)[0]
    path = Path(catalog.root.path("results", first, "policy", RESIDENT_FILE))
    info = json.loads(path.read_text())
    there = {**json.loads(info["rebuild"]["machine"]), "flags": "avx512f amx_tile"}
    changed = {**info["rebuild"], "seed": info["rebuild"]["seed"] + 1, "machine": json.dumps(there)}
    path.write_text(json.dumps({**info, "rebuild": changed}))
    with live.scope(info["rebuild"]["run"]), pytest.raises(CatalogError, match="another kind of machine") as read:
        catalog.ref(first, "policy").local_path()  # even the run's own name, elsewhere, marks nothing
    assert "flags: avx512f amx_tile there" in str(read.value) and "nothing is marked" in str(read.value)
    assert not any(catalog.damage_mark(k) for k in _updates(catalog))


@ACROSS_PROCESSES
def test_a_reader_with_other_kernels_and_threads_changes_nothing_and_the_run_still_rebuilds(every_second, tmp_path):
    """Issue 93's reproduction: versions kept in memory, read from a process whose CPU
    kernels differ (torch told to use its plainest) and with another thread count. Its
    replay either reproduces the digest or fails in one line; either way nothing is marked,
    and the run that made them still rebuilds them exactly."""
    import os
    import subprocess
    import sys

    from common import live

    catalog = _copy(every_second, tmp_path)
    first = _updates(catalog)[0]
    run = json.loads(Path(catalog.root.path("results", first, "policy", RESIDENT_FILE)).read_text())["rebuild"]["run"]
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    code = (
        "import sys, torch; torch.set_num_threads(1); import stages; from catalog.store import Catalog\n"
        "from common.errors import CatalogError\n"
        f"try: Catalog({str(catalog.root.path())!r}).ref({first!r}, 'policy').local_path()\n"
        "except CatalogError as e: print(e); sys.exit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    if done.returncode == 3:
        assert "nothing is marked" in done.stdout and len(done.stdout.strip().splitlines()) == 1
    assert not any(catalog.damage_mark(k) for k in _updates(catalog))
    resident.release()
    with live.scope(run):
        rebuilt = catalog.ref(first, "policy").local_path()
    assert (rebuilt / "model.safetensors").is_file()  # its digest checked: the replay was exact


def test_a_rebuild_after_the_update_code_changed_says_so_and_marks_nothing(every_second, tmp_path):
    catalog = _copy(every_second, tmp_path)
    first = _updates(catalog)[0]
    path = Path(catalog.root.path("results", first, "policy", RESIDENT_FILE))
    info = json.loads(path.read_text())
    assert info["rebuild"]["code"] == rebuild.update_code()
    changed = {**info["rebuild"], "seed": info["rebuild"]["seed"] + 1, "code": "0" * 64}  # as if made by other code
    path.write_text(json.dumps({**info, "rebuild": changed}))
    with pytest.raises(CatalogError, match="the update's code has changed since it was made"):
        catalog.ref(first, "policy").local_path()
    assert catalog.damage_mark(first) is None


def test_a_version_made_on_another_kind_of_device_is_not_marked_damaged(every_second, tmp_path):
    """The adversary: a recipe recorded on a GPU, replayed on this CPU. Its floats were
    never going to match, so the read fails in one line and marks nothing."""
    catalog = _copy(every_second, tmp_path)
    first = _updates(catalog)[0]
    path = Path(catalog.root.path("results", first, "policy", RESIDENT_FILE))
    info = json.loads(path.read_text())
    assert info["rebuild"]["device"] == "cpu"
    changed = {**info["rebuild"], "seed": info["rebuild"]["seed"] + 1, "device": "cuda"}
    path.write_text(json.dumps({**info, "rebuild": changed}))
    with pytest.raises(CatalogError, match="made on cuda and is replayed on cpu") as failed:
        catalog.ref(first, "policy").local_path()
    assert "\n" not in str(failed.value)
    assert catalog.damage_mark(first) is None


def test_where_a_replay_would_not_be_exact_every_version_is_stored_whole(tmp_path, monkeypatch):
    """On a GPU without deterministic kernels (`rebuild.replay_exact`), no version is kept
    in memory: a resume or a lost worker group reads versions, never replays them."""
    monkeypatch.setattr(rebuild, "replay_exact", lambda cfg: False)
    resident.release()
    (tmp_path / "spec.yaml").write_text(SPEC)
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "spec.yaml"), catalog)
    resident.release()
    updates = _updates(catalog)
    assert len(updates) == 4
    assert all(catalog.ref(k, "policy").resident() is None for k in updates)


def test_a_recipe_with_settings_that_are_not_finite_is_read_back():
    from catalog.keys import canonical
    from stages.update import UpdateConfig

    cfg = UpdateConfig(clip_ratio_high=float("inf"))
    stored = json.loads(json.dumps(canonical(cfg)))  # as resident.json holds it
    assert stored["clip_ratio_high"] == "inf"
    assert from_canonical(UpdateConfig, stored) == cfg


def test_two_processes_materialising_one_version_both_get_it(every_second, tmp_path, monkeypatch):
    catalog = _copy(every_second, tmp_path)
    ref = catalog.ref(_updates(catalog)[0], "policy")
    rename = Path.rename

    def raced(self: Path, target: Path) -> Path:  # another process renames its copy into place first
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / "model.safetensors").write_bytes(b"theirs")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", raced)
    folder = resident.materialize(ref)
    assert (folder / "model.safetensors").read_bytes() == b"theirs"
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "no partial copy left"


def test_a_version_for_vllm_actors_is_materialised_once_by_the_driver(every_second, tmp_path, monkeypatch):
    """The vLLM engine loads files: the driver makes a resident version's checkpoint before
    the actors ask for it, and an actor (here: this process with nothing able to rebuild)
    finds it made instead of replaying the chain itself."""
    from stages.engines.hosts import engine_policy

    catalog = _copy(every_second, tmp_path)
    ref = catalog.ref(_updates(catalog)[0], "policy")
    assert engine_policy(ref, False) is ref  # a file path, not weights from memory
    resident.release()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the actor rebuilt the chain")

    monkeypatch.setattr(resident, "bring", no_rebuild)
    assert (ref.local_path() / "model.safetensors").is_file()


def test_the_resident_trainer_trains_as_a_ray_train_fit_does(every_version, tmp_path):
    """The same update through the resident trainer and through a Ray Train fit in local
    mode (the path of `workers >= 1` and LoRA): byte-identical weights and optimizer state."""
    from stages.training.fit import OPTIMIZER_FILE, LocalContext, fit
    from stages.training.loops import ActorJob, actor_loop
    from stages.update import UpdateConfig

    catalog = every_version
    key = _updates(catalog)[1]
    info = catalog.manifest(key)
    cfg = from_canonical(UpdateConfig, info["config"])
    policy, reference = catalog.at(info["inputs"]["policy"]), catalog.at(info["inputs"]["reference"])
    batch = catalog.at(info["inputs"]["batch"])
    table = resident.read_batch(batch, cfg)
    seed = 3 * 1_000_003 + 1  # the run seed 3, iteration 1 (StageContext.step_seed)
    out = tmp_path / "fit"
    fit(
        LocalContext("update-test", num_cpus=2),
        actor_loop,
        ActorJob(key=key, seed=seed, cfg=cfg, policy=policy, reference=reference),
        table,
        cfg.optim,
        out,
    )
    stored = catalog.ref(key, "policy").local_path()
    assert (out / "model.safetensors").read_bytes() == (stored / "model.safetensors").read_bytes()
    a, b = torch.load(out / OPTIMIZER_FILE), torch.load(stored / OPTIMIZER_FILE)
    assert all(torch.equal(a["state"][i][n], b["state"][i][n]) for i in a["state"] for n in a["state"][i])


def test_engines_get_each_new_version_from_memory(every_second):
    """No update after the first reads a checkpoint, and no rollout loads one: the weights
    reach the engine from the trainer (`perf/memory_weight_loads`)."""
    rows = query(
        every_second,
        "select iteration, name, value from metrics where stage = 'rollout' "
        "and name in ('perf/weight_loads', 'perf/memory_weight_loads') order by iteration, name",
    ).to_pylist()
    by = {(r["iteration"], r["name"]): r["value"] for r in rows}
    assert [by[(i, "perf/memory_weight_loads")] for i in (1, 2, 3)] == [1.0, 1.0, 1.0]
    assert [by[(i, "perf/weight_loads")] for i in (1, 2, 3)] == [0.0, 0.0, 0.0]


def test_a_lost_trainer_is_rebuilt_and_the_run_ends_with_the_same_weights(tmp_path, every_version, monkeypatch):
    """The trainer is dropped after every update (as if its process had died): each
    rollout and update rebuilds it from the last stored version and the batches since."""
    original = resident.update

    def forgetting(*args, **kwargs):
        out = original(*args, **kwargs)
        resident.release()
        return out

    monkeypatch.setattr(resident, "update", forgetting)
    (tmp_path / "spec.yaml").write_text(SPEC)
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "spec.yaml"), catalog)
    last = _updates(catalog)[-1]
    assert _files(catalog.ref(last, "policy").local_path()) == _files(every_version.ref(last, "policy").local_path())


@pytest.mark.parametrize("where", ["save", "state"])
def test_a_trainer_lost_while_saving_or_publishing_is_restarted_to_the_same_weights(
    tmp_path, every_version, monkeypatch, where
):
    """A worker lost while the new version is stored (`save`) or handed to the engines
    (`state`) loses the group as one lost while training does: the update runs again from
    the same policy, batch and seed, and the run ends with the undisturbed weights."""
    from stages.training.group import GroupLost

    lost: list[int] = []
    original = getattr(resident.Trainer, where)

    def failing_once(self, *args, **kwargs):
        if not lost:
            lost.append(1)
            raise GroupLost("a trainer worker died (as if its node were lost)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(resident.Trainer, where, failing_once)
    (tmp_path / "spec.yaml").write_text(SPEC.replace("checkpoint_every: 2", "checkpoint_every: 1"))
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "spec.yaml"), catalog)
    assert lost == [1]
    first = _updates(catalog)[0]
    assert catalog.manifest(first)["metrics"]["perf/worker_restarts"] == 1.0
    last = _updates(catalog)[-1]
    assert _files(catalog.ref(last, "policy").local_path()) == _files(every_version.ref(last, "policy").local_path())


def test_an_engine_actor_gets_weights_through_the_object_store(tmp_path, every_version, shared_ray):
    (tmp_path / "spec.yaml").write_text(SPEC.replace("actors: 0", "actors: 1"))
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "spec.yaml"), catalog)
    rows = query(
        catalog, "select iteration, value from metrics where name = 'perf/memory_weight_loads' order by iteration"
    ).to_pylist()
    assert [r["value"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    # `actors` is part of the rollout's key; the weights are those of the run in this process
    weights = [c.ref(_updates(c)[-1], "policy").local_path() / "model.safetensors" for c in (catalog, every_version)]
    assert weights[0].read_bytes() == weights[1].read_bytes()


#: the same run with a worker group of two (DDP over gloo), kept for the run
GROUP = SPEC.replace("optim: {", "optim: {workers: 2, ")


def _group_run(folder: Path, monkeypatch, after=None) -> tuple[Catalog, list[list[int]]]:
    """Run `GROUP` in `folder`; the worker group's process ids after each update
    (`after(iteration, pids)` is called after each update)."""
    import ray

    pids: list[list[int]] = []
    original = resident.update

    def watched(ctx, *args, **kwargs):
        out = original(ctx, *args, **kwargs)
        pids.append(ray.get([m.pid.remote() for m in resident._held_now().trainer.group.members]))
        if after is not None:
            after(ctx.iteration, pids)
        return out

    monkeypatch.setattr(resident, "update", watched)
    (folder / "spec.yaml").write_text(GROUP)
    catalog = Catalog(str(folder / "catalog"))
    run_spec(str(folder / "spec.yaml"), catalog)  # in the module's Ray session (`ray_session`)
    return catalog, pids


@pytest.fixture(scope="module")
def group_run(tmp_path_factory, ray_session):
    with pytest.MonkeyPatch.context() as mp:
        return _group_run(tmp_path_factory.mktemp("group"), mp)


def test_a_worker_group_is_started_once_for_the_run(group_run):
    catalog, pids = group_run
    assert len(pids) == 4 and all(p == pids[0] for p in pids) and len(set(pids[0])) == 2
    rows = query(
        catalog, "select iteration, in_memory from results where stage = 'update' order by iteration"
    ).to_pylist()
    assert [r["in_memory"] for r in rows] == [True, False, True, False]
    placed = query(catalog, "select count(*) as n from placement where role = 'worker'").to_pylist()
    assert placed[0]["n"] == 8  # two workers for each of the four updates


def test_a_worker_killed_between_checkpoints_is_replaced_and_replays_to_the_same_weights(
    group_run, tmp_path, monkeypatch, shared_ray
):
    """A member of the group dies after the update of iteration 2, whose version (3) was
    never stored: the next update starts a new group, rebuilds version 3 from version 2
    and its batch, checks its digest, and the run ends with the undisturbed run's weights."""
    import os
    import signal

    def kill(iteration, pids):
        if iteration == 2:
            os.kill(pids[-1][1], signal.SIGKILL)

    catalog, pids = _group_run(tmp_path, monkeypatch, kill)
    assert pids[3] != pids[2]  # a new group
    restarts = query(
        catalog, "select iteration, value from metrics where name = 'perf/worker_restarts' order by iteration"
    ).to_pylist()
    assert [r["value"] for r in restarts] == [0.0, 0.0, 0.0, 1.0]
    last = [c.ref(_updates(c)[-1], "policy").local_path() for c in (catalog, group_run[0])]
    assert _files(last[0]) == _files(last[1])


def test_show_and_runs_say_which_versions_are_stored(every_second, tmp_path):
    from typer.testing import CliRunner

    from pipelines.cli.main import app

    root = every_second.root.uri
    listed = CliRunner().invoke(app, ["runs", "--catalog", root])
    assert listed.exit_code == 0 and "2 of 4" in listed.stdout, listed.output
    (tmp_path / "spec.yaml").write_text(SPEC)
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "spec.yaml"), "--catalog", str(tmp_path / "new")])
    assert shown.exit_code == 0, shown.output
    assert "would run 4 (stored whole: 2, the rest kept in memory)" in shown.stdout


def test_a_member_failing_because_a_peer_died_loses_the_group(monkeypatch):
    """A survivor's collective can fail (the connection closed) before Ray marks its dead peer:
    that task error is the group lost, to be started again; a task error while every member
    lives is the error itself. The dead member's node is passed over by the next groups
    while Ray may still list it alive (a member placed there would die again), unless no
    other node has CPUs, and again once `SHUN_SECONDS` have passed."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    from stages.training import group as groups
    from stages.training.group import Group, GroupLost

    class _Member:
        def __init__(self, alive: bool) -> None:
            self.pid = type("Method", (), {"remote": staticmethod(lambda: alive)})

    def get(alive, timeout=None):
        if not alive:
            raise RayActorError()
        return 1

    def failed():
        raise RayTaskError("apply", "Traceback ...", RuntimeError("Connection closed by peer"))

    def fresh() -> Group:
        new = Group.__new__(Group)
        new.use_gpu, new.nodes = False, [None, None]
        return new

    def placed(listed: tuple[str, ...]) -> list[str | None]:
        cpus = [{"NodeID": n, "Alive": True, "Resources": {"CPU": 4.0}} for n in listed]
        monkeypatch.setattr(ray, "nodes", lambda: [*cpus, {"NodeID": "head", "Alive": True, "Resources": {}}])
        new = fresh()
        for rank in range(2):
            new._remote(rank)
        return new.nodes

    n1, n2 = "1a" * 28, "2b" * 28  # node ids as Ray writes them
    monkeypatch.setattr(ray, "get", get)
    groups._shunned().clear()
    assert placed((n1, n2)) == [n1, n2]
    group = fresh()
    group._started, group.nodes = [_Member(True), _Member(False)], [n1, n2]
    with pytest.raises(GroupLost, match="a trainer worker died"):
        group._call(failed)
    assert set(groups._shunned()) == {n2}
    assert placed((n1, n2)) == [n1, n1]  # n2 still listed alive: passed over
    assert placed((n2,)) == [n2, n2]  # no other node with CPUs
    groups._shunned()[n2] -= groups.SHUN_SECONDS
    assert placed((n1, n2)) == [n1, n2]
    group._started = [_Member(True), _Member(True)]
    with pytest.raises(RayTaskError):
        group._call(failed)


def test_a_member_is_held_to_its_node_and_a_node_gone_before_it_starts_loses_the_group(shared_ray, monkeypatch):
    """A member reserves no CPU, and Ray places such an actor on a node drawn at random
    whatever a soft affinity asks: the group pins each member to its node. A node that Ray
    still lists alive but is gone leaves its member unschedulable: that is the group lost
    (to be started again), with the node passed over, not an error of the update."""
    import ray

    from stages.training import group as groups
    from stages.training.group import Group, GroupLost

    gone = "3c" * 28
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": gone, "Alive": True, "Resources": {"CPU": 2.0}}])
    groups._shunned().clear()
    with pytest.raises(GroupLost, match=r"a trainer worker died: .*NodeAffinitySchedulingStrategy"):
        Group(1, use_gpu=False)
    assert set(groups._shunned()) == {gone}


def test_a_group_whose_start_fails_leaves_no_member(shared_ray, monkeypatch):
    """A start that fails once some members are up (here the driver is interrupted while
    they join) kills the members it started: none is left holding a process."""
    import ray
    from ray.exceptions import RayActorError

    from stages.training.group import Group

    made: list[object] = []
    remote = Group._remote

    def recorded(self, rank):  # each member's actor class, its handles kept to be asked after
        cls = remote(self, rank)

        class Recorded:
            @staticmethod
            def remote(*args):
                made.append(cls.remote(*args))
                return made[-1]

        return Recorded

    real_get, calls = ray.get, [0]

    def interrupted(*args, **kwargs):  # the second get of the start: the members' join
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real_get(*args, **kwargs)

    monkeypatch.setattr(Group, "_remote", recorded)
    monkeypatch.setattr(ray, "get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Group(2, use_gpu=False)
    monkeypatch.setattr(ray, "get", real_get)
    assert calls[0] == 2 and len(made) == 2
    for member in made:
        with pytest.raises(RayActorError):
            ray.get(member.pid.remote(), timeout=30)
