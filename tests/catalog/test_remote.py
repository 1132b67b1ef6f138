"""A catalog on object storage: a whole pipeline on s3:// against a loopback S3
server (moto's), with the same caching, run records and views as a local root."""

import pytest

from catalog.query import query
from catalog.store import Catalog
from tests.conftest import CALLS, TEST_PIPELINE, run_spec
from tests.s3 import loopback_s3

moto_server = pytest.importorskip("moto.server", reason="moto[server] (in the test extra) serves S3 on loopback")


@pytest.fixture(scope="module")
def s3_uri():
    with loopback_s3("runs-bucket") as endpoint:
        yield f"s3://runs-bucket/catalog?{endpoint}"


def test_a_pipeline_runs_caches_and_is_queried_on_s3(spec_file, s3_uri):
    catalog = Catalog(s3_uri)
    assert not catalog.root.is_local
    path = spec_file(TEST_PIPELINE)
    first, _ = run_spec(path, catalog)
    assert first.ran == 10
    CALLS.clear()
    again, _ = run_spec(path, catalog)
    assert again.ran == 0 and sum(CALLS.values()) == 0  # found every result on the object store
    counts = query(catalog, "select iteration, value from metrics where name = 'actor/count' order by iteration")
    assert counts.to_pylist() == [{"iteration": i, "value": float(i + 1)} for i in range(3)]  # artifacts via @prev
    assert query(catalog, "select count(*) from t_numbers").column(0)[0].as_py() == 3 * 4
    assert query(catalog, "select status from runs").column(0).to_pylist() == ["finished"]


def test_the_starpo_stages_train_with_checkpoints_on_s3(spec_file, s3_uri, monkeypatch):
    """Every update a Ray Train fit (`update.resident: false`, the path of FSDP and LoRA)."""
    import ray.train

    from tests.stages.conftest import TINY_GRPO

    storage: list[str] = []  # where Ray Train puts its checkpoints: inside the catalog, reachable from any node
    real = ray.train.RunConfig
    monkeypatch.setattr(ray.train, "RunConfig", lambda **kw: storage.append(kw["storage_path"]) or real(**kw))
    catalog = Catalog(s3_uri.replace("/catalog?", "/starpo?"))
    summary, _ = run_spec(spec_file(TINY_GRPO.replace("update: {optim:", "update: {resident: false, optim:")), catalog)
    assert summary.ran == 2 + 3 * 2
    assert len(storage) == 2 and all(p.startswith("runs-bucket/starpo/_staging/shared/update-") for p in storage)
    assert not catalog.root.list_dirs("_staging", "shared", storage[0].rsplit("/", 1)[1])  # cleaned up
    versions = query(catalog, "select distinct iteration, policy_version from trajectories order by 1").to_pylist()
    assert versions == [{"iteration": 0, "policy_version": 0}, {"iteration": 1, "policy_version": 1}]


def test_a_version_kept_in_memory_is_rebuilt_from_s3(spec_file, s3_uri, tmp_path, monkeypatch):
    """The resident trainer on a catalog on S3: the first version is kept in memory (its
    result a digest and a recipe), and a process that reads it rebuilds it from the
    stored warm start and batch into the artifact cache, to the recorded weights."""
    from catalog.datasets import RESIDENT_FILE
    from stages.training import resident
    from tests.stages.conftest import TINY_GRPO

    monkeypatch.setenv("STARPO_ARTIFACTS", str(tmp_path / "cache"))
    catalog = Catalog(s3_uri.replace("/catalog?", "/resident?"))
    run_spec(spec_file(TINY_GRPO), catalog)
    first, last = sorted(
        (k for k in catalog.result_keys() if k.startswith("update-")), key=lambda k: catalog.manifest(k)["iteration"]
    )
    assert f"policy/{RESIDENT_FILE}" in catalog.manifest(first)["files"]
    assert "policy/model.safetensors" in catalog.manifest(last)["files"]
    resident.release()
    rebuilt = catalog.ref(first, "policy").local_path()
    assert rebuilt.is_relative_to(tmp_path / "cache") and (rebuilt / "model.safetensors").is_file()


def test_artifacts_fetched_at_once_are_whole(s3_uri, tmp_path, monkeypatch):
    """Engine actors on one node fetch the same policy at once: each gets the whole
    folder, never one that another fetch is still writing (a file read empty or half
    written), and no part is left behind. Three policies, eight fetches of each."""
    import hashlib
    import os
    from concurrent.futures import ThreadPoolExecutor

    from catalog.datasets import Artifact

    monkeypatch.setenv("STARPO_ARTIFACTS", str(tmp_path / "cache"))
    catalog = Catalog(s3_uri.replace("/catalog?", "/fetched?"))
    blob = os.urandom(1 << 22)
    shards = {f"shard{i}.bin": blob[i:] + blob[:i] for i in range(4)}
    keys = [f"update-{n}" for n in range(3)]
    for key in keys:
        writer = catalog.writer(key, {"policy": Artifact()})
        for name, data in shards.items():
            (writer.output_dir("policy") / name).write_bytes(data)
        writer.commit({}, {}, {})
    want = {name: hashlib.sha256(data).hexdigest() for name, data in shards.items()}

    def fetch(key: str) -> dict[str, str]:
        folder = Catalog(catalog.root.uri).ref(key, "policy").local_path()
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir()}

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(fetch, [k for k in keys for _ in range(8)]))
    assert got == [want] * len(got)
    folders = sorted(p for p in (tmp_path / "cache").rglob("*") if p.name.startswith(("policy-", ".")))
    assert [p.parent.name for p in folders] == keys  # one whole folder a result, no partial download left


def test_the_bytes_a_step_uses_are_the_bytes_checked(s3_uri, tmp_path, monkeypatch):
    """A download is used only as its manifest lists it: a result quarantined and computed
    again under the same key is downloaded again (not served the old bytes); a stored file
    changed at the same size is refused, not loaded; a download changed here is fetched again."""
    from catalog.datasets import Artifact
    from common.errors import CatalogError

    monkeypatch.setenv("STARPO_ARTIFACTS", str(tmp_path / "cache"))
    catalog = Catalog(s3_uri.replace("/catalog?", "/checked?"))

    def commit(data: bytes) -> None:
        writer = catalog.writer("update-1", {"policy": Artifact()})
        (writer.output_dir("policy") / "weights.bin").write_bytes(data)
        writer.commit({}, {}, {})

    commit(b"old" * 1000)
    assert (catalog.ref("update-1", "policy").local_path() / "weights.bin").read_bytes() == b"old" * 1000
    catalog.quarantine("update-1")
    assert not any((tmp_path / "cache").rglob("weights.bin"))  # its downloads forgotten with it
    commit(b"new" * 1000)
    folder = catalog.ref("update-1", "policy").local_path()
    assert (folder / "weights.bin").read_bytes() == b"new" * 1000
    (folder / "weights.bin").write_bytes(b"x")  # the download changed here: fetched again
    assert (catalog.ref("update-1", "policy").local_path() / "weights.bin").read_bytes() == b"new" * 1000
    fs, path = catalog.root.fs, catalog.root.path("results", "update-1", "policy", "weights.bin")
    with fs.open_output_stream(path) as f:  # the stored file changed at the same size, the download gone
        f.write(b"NEW" * 1000)
    import shutil

    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(CatalogError, match=r"weights.bin differs from what was committed \(SHA-256\)"):
        catalog.ref("update-1", "policy").local_path()
    assert not any((tmp_path / "cache").rglob("weights.bin"))  # nothing half-checked left to be found
