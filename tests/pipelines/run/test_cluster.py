"""The cluster path, held: the README's "On a cluster" commands, run as written on a
head and two worker nodes of this machine (`tests.cluster`: each worker node in its own
working directory and TMPDIR), with a catalog on loopback S3 (moto) and nothing else
shared: StarPO-S with its critic, two engine actors for the rollout and the eval, two
Ray Train workers (DDP over gloo). The run gives what the same command gives in one
process (the same result keys, trajectories, evals, and weights bit for bit), its record
says which node did what (the `placement` view), and node faults end in the same result.
Only the placeholders (``HEAD:6379``, ``s3://BUCKET/starpo``) are replaced, and
`SMALL` overrides are added to keep the run to seconds."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog.query import query
from catalog.store import Catalog
from tests.cluster import LocalCluster
from tests.conftest import SMALL_RELATIVE, short_temp
from tests.s3 import CREDENTIALS, loopback_s3

moto_server = pytest.importorskip("moto.server", reason="moto[server] (in the test extra) serves S3 on loopback")

ROOT = Path(__file__).resolve().parents[3]
EXE = Path(sys.executable).parent / "pipeline"
#: the README's commands (`<!-- cluster -->`): the `ray start` lines, then `pipeline run` and `pipeline query`
BLOCK = re.search(r"<!-- cluster -->\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
COMMANDS = [shlex.split(line.split("  #")[0]) for line in BLOCK.splitlines() if line.strip()]
RUN = next(c for c in COMMANDS if c[:2] == ["pipeline", "run"])
QUERY = next(c for c in COMMANDS if c[:2] == ["pipeline", "query"])
#: docs/cluster.md's query of which node played each trajectory
PLAYED_BY = next(
    shlex.split(line)[2]
    for line in (ROOT / "docs" / "cluster.md").read_text().splitlines()
    if line.startswith('pipeline query "with t as')
)
#: one small iteration (the model, batch and evals of the suite's small default)
SMALL = [*SMALL_RELATIVE, "run.iterations=1", "critic.optim.mini_batch_size=2"]


def _as_here(command: list[str], address: str | None, uri: str) -> list[str]:
    """A README command with its placeholders filled (no address: one process, with a
    local Ray of the worker nodes' 8 CPUs, so the actors' reservations fit as there)."""
    out = [a.replace("s3://BUCKET/starpo", uri) for a in command[1:]]
    if "--address" in out:
        at = out.index("--address")
        out[at : at + 2] = ["--address", address] if address else ["-o", "ray.num_cpus=8"]
    return [str(EXE), *out]


@pytest.fixture(scope="module")
def s3():
    """A loopback S3 server with the bucket `cluster`: a catalog URI's query part."""
    with loopback_s3("cluster") as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3):
    nodes = LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2, cpus=4, env=CREDENTIALS)
    yield nodes
    nodes.close()


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **CREDENTIALS, "RAY_AUTH_MODE": "disabled", "PIPELINE_CATALOG": "", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def run(uri: str, cwd: Path, address: str | None = None, *extra: str, **env: str) -> subprocess.Popen[str]:
    """The README's `pipeline run` (small, with `extra` arguments) from `cwd` (its TMPDIR
    there, where a remote catalog's results are staged), not waited for."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*_as_here(RUN, address, uri), *(a for o in SMALL for a in ("-o", o)), *extra],
        cwd=cwd,
        env=_env(TMPDIR=str(short_temp(cwd)), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str], timeout: float = 600) -> str:
    """The run's output once it ends; it must have succeeded."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out + err


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Catalog, float]:
    """The README's run in one process: its catalog, and its seconds."""
    tmp = tmp_path_factory.mktemp("one")
    t0 = time.monotonic()
    finished(run(str(tmp / "cat"), tmp))
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


def test_a_run_on_three_nodes_and_s3_is_the_one_process_run_also_after_a_node_is_lost(
    cluster, s3, undisturbed, tmp_path
):
    """The README's run on three nodes, with a catalog on S3. Once the update's loop runs on
    its worker group of two, the node of one of them is killed (SIGKILL of its raylet and
    every process on it: a machine lost). The update starts its group again on the node
    left and brings it back to its starting policy, and Ray restarts any engine actor that
    was there (actor restarts); the run finishes with the keys, weights, trajectories and
    evals of the one-process run, bit for bit, and says that the group was restarted.
    (First in this module: it leaves the module's cluster one worker node.)"""
    uri = f"s3://cluster/starpo?{s3}"
    t0 = time.monotonic()
    proc = run(uri, tmp_path / "driver", cluster.address)
    with _ended_on_failure(proc):  # a run left going would hold the cluster's CPUs in the next test
        started = _started(cluster.root, 300)
        assert started is not None, "the update's loop never started"
        cluster.stop(_node_of_a_train_worker(cluster, started), hard=True)
        out = finished(proc)
    print(f"3-node cluster {time.monotonic() - t0:.1f} s, one process {undisturbed[1]:.1f} s")
    on_s3, here = Catalog(uri), undisturbed[0]
    _same_run(on_s3, here)
    restarts = query(on_s3, "select value from metrics where name = 'perf/worker_restarts'").to_pylist()
    assert any(r["value"] >= 1 for r in restarts), restarts
    assert "worker group was restarted" in out

    # where each step ran: the driver in one process (Ray attaches it to one of the local raylets), the
    # engine actors (a CPU each) and the update's two workers on the other nodes: the lost one and the
    # one left; the critic's fit in local mode (workers: 0) in the driver's process
    placed = query(on_s3, 'select stage, role, "index", ray_node, rows from placement order by all').to_pylist()
    drivers = {p["ray_node"] for p in placed if p["role"] == "driver" and p["ray_node"]}
    elsewhere = {p["ray_node"] for p in placed if p["role"] != "driver" and p["stage"] != "critic.update"}
    assert len(drivers) == 1 and len(elsewhere | drivers) >= 2, placed
    assert {p["ray_node"] for p in placed if p["stage"] == "critic.update"} == drivers
    roles = {(p["stage"], p["role"]) for p in placed}
    assert {("rollout", "actor"), ("eval", "actor"), ("update", "worker")} <= roles, roles
    assert {p["index"] for p in placed if p["stage"] == "update" and p["role"] == "worker"} == {0, 1}
    # which node played each trajectory: the actor whose rows hold its place in the episode list
    played = query(on_s3, PLAYED_BY).to_pylist()  # docs/cluster.md's query, as written
    assert len(played) == query(on_s3, "select count(*) n from trajectories").to_pylist()[0]["n"]
    assert {p["ray_node"] for p in played} <= elsewhere
    # the one-process run records the same roles, all in its own (local) Ray session
    alone = query(here, "select distinct ray_node from placement where ray_node is not null").to_pylist()
    assert len(alone) == 1 and not {a["ray_node"] for a in alone} & elsewhere
    # the report's stage timings say it too
    from pipelines.report.summary import timings

    ran_on = {r["node"]: r["ran on"] for r in timings(on_s3, "starpo-s")}
    assert ran_on["update"] in ("2 workers on 2 nodes", "2 workers on 1 node"), ran_on
    assert ran_on["rollout"].startswith("2 actors on ") and ran_on["filter"] == "driver", ran_on
    # the README's query, as written but for the catalog
    answer = subprocess.run(_as_here(QUERY, None, uri), env=_env(), capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0 and "worker" in answer.stdout and "actor" in answer.stdout, answer.stderr


@contextlib.contextmanager
def _ended_on_failure(proc: subprocess.Popen[str]) -> Iterator[None]:
    """The run is killed should the block fail, and what it had said is added to the failure."""
    try:
        yield
    except BaseException as exc:
        proc.kill()
        _, err = proc.communicate(timeout=60)
        exc.add_note(f"the run's stderr, to where it was killed:\n{err[-3000:]}")
        raise


def _count(pids: dict[str, list[int]]) -> int:
    return sum(len(p) for p in pids.values())


def _started(folder: Path, timeout: float) -> Path | None:
    """The `starts` file of rank 0 of the update's worker group under `folder` (the
    member's scratch folder on its node, `stages.training.signals`) once its loop has
    started, within `timeout` s; None if it never did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = next(folder.rglob(".train-*/starts"), None)
        if found is not None:
            return found
        time.sleep(0.1)
    return None


def _node_of_a_train_worker(nodes: LocalCluster, starts: Path) -> str:
    """The worker node (its name) that runs rank 0 of the update's worker group: where its
    scratch folder (`starts`) lies, in its node's TMPDIR. A member reserves no CPU, and Ray
    would place such an actor on a node drawn at random (the head among them) but that the
    group pins each member to a node with CPUs (`stages.training.group`)."""
    node = starts.relative_to(nodes.root).parts[0]
    assert node in nodes.nodes and node != "head", (
        f"rank 0 of the worker group ran on {node}: {nodes.pids('ray::Member')}"
    )
    return node


#: the lost-node run goes as far as the step it loses (the whole run resumed after a loss is the first test's)
TO_FIRST_EVAL = ("--to", "eval_start")


def test_a_node_lost_for_good_fails_the_step_in_one_line_and_the_run_resumes(cluster, s3, undisturbed, tmp_path):
    """The only worker node left (the first test took the other) is killed while the engine
    actors play (the first eval's): nothing can hold them, so after
    ``PIPELINE_NODE_WAIT_SECONDS`` the step fails with one line naming the lost node,
    commits nothing, and the same command, once the node is back, runs the step again to
    the undisturbed result. (The run goes to that step, ``--to eval_start``: a whole run
    resumed after a lost node, to the undisturbed weights, is the first test's.)"""
    left = [name for name in cluster.nodes if name != "head"]
    # the first test took one; should it have failed before, this one still holds (Ray may place an
    # engine actor on the node stopped here before it sees it lost: the failure then names both)
    for name in left[1:]:
        cluster.stop(name, hard=True)
    left = left[:1]
    uri = f"s3://cluster/lost?{s3}"
    proc = run(uri, tmp_path / "driver", cluster.address, *TO_FIRST_EVAL, PIPELINE_NODE_WAIT_SECONDS="5")
    with _ended_on_failure(proc):
        deadline = time.monotonic() + 300
        while _count(cluster.pids("ray::EngineHost")) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.stop(left[0], hard=True)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]  # after the run's display: the one line of the failure
    failed = re.fullmatch(
        r"error: stage '(\w+)'.* failed: NodesLost: 2 engine actor\(s\): "
        r"node\(s\) \w+ \([\d.]+\)(, \w+ \([\d.]+\))? lost, "
        r"and the nodes left have 0 of the 2 CPU it needs; .* run the same command to resume .*",
        last,
    )
    assert failed and sum(line.startswith("error:") for line in err.splitlines()) == 1, err
    catalog = Catalog(uri)  # the failed step committed nothing
    stage = query(catalog, f"select stage from results where node = '{failed.group(1)}'").to_pylist()
    assert stage == [], stage
    cluster.add(left[0])
    finished(run(uri, tmp_path / "driver", cluster.address, *TO_FIRST_EVAL))
    resumed, reference = Catalog(uri), undisturbed[0]
    steps = query(resumed, "select node, iteration, key from steps where status = 'ran' order by all").to_pylist()
    assert failed.group(1) in {s["node"] for s in steps}, steps
    assert all(s in query(reference, "select node, iteration, key from steps").to_pylist() for s in steps), steps
    sql = "select * exclude (run) from evals where policy_version = 0 order by all"  # the first eval's
    evals = query(resumed, sql).to_pylist()
    assert evals and evals == query(reference, sql).to_pylist()
    assert query(resumed, "select count(*) n from evals").to_pylist()[0]["n"] == len(evals)
