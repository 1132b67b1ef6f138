"""A catalog shared with other users: every file a run commits is readable as the umask
allows, whatever mode the library that wrote it chose; a reader without the right to
read gets one line, never a traceback."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from catalog.fs import shared
from catalog.store import Catalog
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


def test_shared_gives_what_the_umask_allows(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir(mode=0o700)
    (folder / "model.safetensors").write_bytes(b"x")
    os.chmod(folder / "model.safetensors", 0o600)
    (folder / "run.sh").write_bytes(b"#!/bin/sh")
    os.chmod(folder / "run.sh", 0o700)
    old = os.umask(0o022)
    os.umask(old)
    shared(folder)
    assert _modes(folder) == {"model.safetensors": 0o666 & ~old, "run.sh": 0o777 & ~old}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~old


def test_every_committed_file_is_readable_by_the_others(tmp_path):
    (tmp_path / "spec.yaml").write_text(TINY_GRPO)
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "spec.yaml"), catalog)
    results = Path(catalog.root.path("results"))
    private = {name: mode for name, mode in _modes(results).items() if not mode & stat.S_IROTH}
    assert not private, f"not readable by others: {sorted(private)[:5]}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_another_user_reads_the_catalog_and_gets_one_line_where_it_cannot_write():
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="shared-catalog-"))  # pytest's own folders are its user's only
    os.chmod(home, 0o755)
    tmp_path = home
    (tmp_path / "spec.yaml").write_text(TINY_GRPO)
    catalog = Catalog(str(tmp_path / "catalog"))
    try:
        run_spec(str(tmp_path / "spec.yaml"), catalog)
        _as_another_user(tmp_path)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _as_another_user(tmp_path: Path) -> None:
    import subprocess
    import sys

    def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
        code = "import sys; from pipelines.cli.main import invoke; sys.exit(invoke(sys.argv[1:]))"
        return subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)},
            cwd=str(tmp_path),
        )

    verified = as_nobody("verify", "--catalog", str(tmp_path / "catalog"))
    assert verified.returncode == 0, verified.stderr
    listed = as_nobody("runs", "--catalog", str(tmp_path / "catalog"))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    ran = as_nobody("run", str(tmp_path / "spec.yaml"), "--catalog", str(tmp_path / "catalog"), "-o", "run.seed=9")
    assert ran.returncode != 0 and "Traceback" not in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1 and "permission denied" in ran.stderr.lower(), ran.stderr
