"""The Ray session: workers import this project's packages whatever the driver's
working directory holds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pipelines.run.session import package_root, worker_runtime_env

DRIVER = textwrap.dedent(
    """
    import ray
    from pipelines.run.session import start_ray

    start_ray(None, num_cpus=1)

    @ray.remote
    def imported():
        import envs
        return hasattr(envs, "make")

    print("make:", ray.get(imported.remote()))
    ray.shutdown()
    """
)


def test_workers_import_the_packages_from_a_folder_that_shadows_one(tmp_path):
    """`configs/` holds `envs/` (YAML files): Ray puts the working directory first on
    its workers' path, and there `import envs` found that folder, a namespace package
    without `make` (`pipeline run starpo.yaml` from inside configs/ failed at eval)."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "frozenlake.yaml").write_text("rollout: {env: frozenlake}\n")
    (tmp_path / "driver.py").write_text(DRIVER)
    out = subprocess.run(
        [sys.executable, "driver.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert "make: True" in out.stdout, out.stdout + out.stderr[-2000:]


def test_the_package_root_goes_before_a_users_pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/mine")
    env = worker_runtime_env({"env_vars": {"OMP_NUM_THREADS": "1"}, "pip": ["x"]})
    assert env["env_vars"] == {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{package_root()}:/mine"}
    assert env["pip"] == ["x"]
