"""The cluster path, held: a head and two worker nodes on this machine (`tests.cluster`),
each worker node in its own working directory and TMPDIR, a catalog on loopback S3
(moto) and nothing else shared. A small StarPO spec with two engine actors for the
rollout and the eval, two Ray Train workers (DDP over gloo) and the critic runs there
with ``--address`` as the README says, and gives what the same command gives in one
process: the same result keys, the same trajectories, the same final weights; and its
run record says which node did what (the `placement` view)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catalog.query import query
from catalog.store import Catalog
from tests.cluster import LocalCluster
from tests.stages.conftest import TINY_STARPO

moto_server = pytest.importorskip("moto.server", reason="moto[server] (in the test extra) serves S3 on loopback")

EXE = Path(sys.executable).parent / "pipeline"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
#: engine actors that reserve a CPU (the head has none, so they land on worker nodes), two
#: Ray Train workers, the critic; one iteration and its eval
SETTINGS = (
    "run.name=cl",
    "run.iterations=1",
    "pipeline.eval_start=null",
    "pipeline.eval.every=1",
    "rollout.actors=2",
    "rollout.actor_cpus=1",
    "eval.actors=2",
    "eval.actor_cpus=1",
    "update.optim.workers=2",
)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A loopback S3 server and a bucket: (the catalog URI's endpoint part, bucket)."""
    import pyarrow.fs as pafs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1", allow_bucket_creation=True
    ).create_dir("cluster")
    yield f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3):
    nodes = LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2, cpus=3, env=CREDENTIALS)
    yield nodes
    nodes.close()


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **CREDENTIALS, "RAY_AUTH_MODE": "disabled", "PIPELINE_CATALOG": "", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def pipeline(*args: str, cwd: Path, address: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    extra = ["--address", address] if address else []
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(EXE), *args, *extra], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=600
    )


def _spec(tmp: Path) -> Path:
    path = tmp / "starpo-tiny.yaml"
    path.write_text(TINY_STARPO)
    return path


OVERRIDES = [a for o in SETTINGS for a in ("-o", o)]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Catalog, float]:
    """The spec run in one process (a local Ray with the worker nodes' 6 CPUs, so the
    actors' reservations fit as they do there): its catalog, and its seconds."""
    tmp = tmp_path_factory.mktemp("one")
    t0 = time.monotonic()
    done = pipeline("run", str(_spec(tmp)), "--catalog", str(tmp / "cat"), *OVERRIDES, "-o", "ray.num_cpus=6", cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return Catalog(str(tmp / "cat")), time.monotonic() - t0


def _same_run(catalog: Catalog, reference: Catalog) -> None:
    """The same steps and keys, trajectories, evals and final weights (bit for bit: the
    same two-rank DDP, and gloo sums two numbers the same way wherever the ranks are)."""
    for sql in (
        "select node, iteration, key from steps order by all",
        'select * from trajectories order by iteration, "group", sample',
        "select * exclude (run) from evals order by all",
    ):
        assert query(catalog, sql).to_pylist() == query(reference, sql).to_pylist(), sql
    assert query(catalog, "select count(*) n from evals").to_pylist()[0]["n"] > 0
    for prefix, output in (("update-", "policy"), ("critic_update-", "critic")):
        a, b = _weights(catalog, prefix, output), _weights(reference, prefix, output)
        assert a.keys() == b.keys() and a
        worst = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert worst == 0.0, (prefix, worst)


def _weights(catalog: Catalog, prefix: str, output: str) -> dict:
    from safetensors.torch import load_file

    key = next(k for k in catalog.result_keys() if k.startswith(prefix))
    folder = catalog.ref(key, output).local_path()
    return {f"{f.name}:{k}": v for f in sorted(folder.rglob("*.safetensors")) for k, v in load_file(f).items()}


def test_a_run_on_three_nodes_and_s3_is_the_one_process_run(cluster, s3, undisturbed, tmp_path):
    uri = f"s3://cluster/starpo?{s3}"
    t0 = time.monotonic()
    remote = pipeline(
        "run", str(_spec(tmp_path)), "--catalog", uri, *OVERRIDES, cwd=tmp_path / "driver", address=cluster.address
    )
    assert remote.returncode == 0, remote.stderr[-3000:]
    print(f"3-node cluster {time.monotonic() - t0:.1f} s, one process {undisturbed[1]:.1f} s")
    on_s3, here = Catalog(uri), undisturbed[0]
    _same_run(on_s3, here)

    # where each step ran: the driver on the head, the actors and the update's workers on the worker
    # nodes; the critic's fit in local mode (workers: 0) in the driver's process
    placed = query(on_s3, 'select stage, role, "index", ray_node, rows from placement order by all').to_pylist()
    drivers = {p["ray_node"] for p in placed if p["role"] == "driver" and p["ray_node"]}
    elsewhere = {p["ray_node"] for p in placed if p["role"] != "driver" and p["stage"] != "critic.update"}
    assert len(drivers) == 1 and elsewhere and not drivers & elsewhere, placed
    assert {p["ray_node"] for p in placed if p["stage"] == "critic.update"} == drivers
    roles = {(p["stage"], p["role"]) for p in placed}
    assert {("rollout", "actor"), ("eval", "actor"), ("update", "worker")} <= roles, roles
    assert sorted(p["index"] for p in placed if p["stage"] == "update" and p["role"] == "worker") == [0, 1]
    # which node played each trajectory: the actor whose rows hold its place in the episode list
    played = query(
        on_s3,
        'with t as (select iteration, "group", sample, row_number() over (partition by iteration '
        'order by "group", sample) - 1 as i from trajectories), a as (select p.iteration, p."index", p.ray_node, '
        'p.rows, sum(p.rows) over (partition by p.iteration order by p."index") - p.rows as first '
        "from placement p where p.stage = 'rollout' and p.role = 'actor') "
        'select t."group", t.sample, a.ray_node from t join a on t.iteration = a.iteration '
        "and t.i >= a.first and t.i < a.first + a.rows order by all",
    ).to_pylist()
    assert len(played) == query(on_s3, "select count(*) n from trajectories").to_pylist()[0]["n"]
    assert {p["ray_node"] for p in played} <= elsewhere
    # the one-process run records the same roles, all in its own (local) Ray session
    alone = query(here, "select distinct ray_node from placement where ray_node is not null").to_pylist()
    assert len(alone) == 1 and not {a["ray_node"] for a in alone} & elsewhere
    print(json.dumps(placed[:3]))


def _started(folder: Path, timeout: float) -> bool:
    """Whether a fit's loop has started on rank 0 under `folder` (its scratch folder's
    `starts` file, `stages.training.signals`), within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(folder.rglob(".ckpt-*/starts")):
            return True
        time.sleep(0.1)
    return False


def _node_of_a_train_worker(nodes: LocalCluster) -> str:
    """The cluster node (its `ray start` session) of a running Ray Train worker."""
    for pid in subprocess.run(["pgrep", "-f", "RayTrainWorker"], capture_output=True, text=True).stdout.split():
        sid = subprocess.run(["ps", "-o", "sid=", "-p", pid], capture_output=True, text=True).stdout.strip()
        for name, proc in nodes.nodes.items():
            if sid and int(sid) == proc.pid and name != "head":
                return name
    raise AssertionError("no Ray Train worker on a worker node")


def _watch_run(nodes: LocalCluster, uri: str, driver: Path, **env: str) -> subprocess.Popen[str]:
    """`pipeline run` of the spec on `nodes`, from `driver` (its TMPDIR there, where a
    remote catalog's results are staged), not waited for."""
    (driver / "tmp").mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [str(EXE), "run", str(_spec(driver)), "--catalog", uri, *OVERRIDES, "--address", nodes.address],
        cwd=driver,
        env=_env(TMPDIR=str(driver / "tmp"), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_node_lost_during_the_update_is_replaced_and_the_run_is_exact(s3, undisturbed, tmp_path, tmp_path_factory):
    """Once the update's loop runs on its two Ray Train workers, the node of one of them
    is killed (SIGKILL of its raylet and every process on it: a machine lost). Ray
    restarts the worker group on the node left (`FailureConfig`) and any engine actor
    that was there (actor restarts); the run finishes with the weights, trajectories and
    evals of an undisturbed run, and says that the group was restarted."""
    nodes = LocalCluster(tmp_path_factory.mktemp("faults"), workers=2, cpus=4, env=CREDENTIALS)
    uri = f"s3://cluster/faults?{s3}"
    try:
        proc = _watch_run(nodes, uri, tmp_path / "driver")
        assert _started(tmp_path / "driver", 300), "the update's loop never started"
        nodes.stop(_node_of_a_train_worker(nodes), hard=True)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    finally:
        nodes.close()
    faulted = Catalog(uri)
    _same_run(faulted, undisturbed[0])
    restarts = query(faulted, "select value from metrics where name = 'perf/worker_restarts'").to_pylist()
    assert any(r["value"] >= 1 for r in restarts), restarts
    assert "worker group was restarted" in out + err


def _pids(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def test_a_node_lost_for_good_fails_the_step_in_one_line_and_the_run_resumes(
    s3, undisturbed, tmp_path, tmp_path_factory
):
    """The only worker node is killed while the rollout's engine actors play: nothing
    can hold them, so after ``PIPELINE_NODE_WAIT_SECONDS`` the step fails with one line
    naming the lost node, commits nothing, and the same command, once the node is back,
    finishes the run with the undisturbed result."""
    nodes = LocalCluster(tmp_path_factory.mktemp("lost"), workers=1, cpus=4, env=CREDENTIALS)
    uri = f"s3://cluster/lost?{s3}"
    try:
        proc = _watch_run(nodes, uri, tmp_path / "driver", PIPELINE_NODE_WAIT_SECONDS="5")
        deadline = time.monotonic() + 300
        while len(_pids("EngineHost")) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        nodes.stop("node1", hard=True)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, err[-3000:]
        last = err.strip().splitlines()[-1]  # after the run's display: the one line of the failure
        assert last.startswith("error: stage 'rollout' (iteration 0) failed: NodesLost: 2 engine actor(s): node(s) "), (
            err
        )
        assert sum(line.startswith("error:") for line in err.splitlines()) == 1, err
        err = last
        assert "lost, and the nodes left have 0 of the 2 CPU it needs" in err and "run the same command" in err
        catalog = Catalog(uri)
        assert not [k for k in catalog.result_keys() if k.startswith("rollout-")]
        nodes.add("node1")
        again = _watch_run(nodes, uri, tmp_path / "driver")
        _, err = again.communicate(timeout=600)
        assert again.returncode == 0, err[-3000:]
    finally:
        nodes.close()
    _same_run(Catalog(uri), undisturbed[0])
