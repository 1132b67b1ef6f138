"""A disk that fills while a step writes its result: one line naming the catalog and the
space, nothing half-written kept, and the same command resumes once there is room."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from typer.testing import CliRunner

from catalog.datasets import Artifact, Table
from catalog.upkeep import verify
from pipelines.cli.main import app
from stages.registry import StageContext, StageResult, stage

FULL = {"left": 0}  # bytes the disk still takes; <= 0: no limit


@dataclass(frozen=True)
class _Big:
    mib: int = 3


@stage("t.big", config=_Big, outputs={"blob": Artifact(), "rows": Table()})
def big(ctx: StageContext, cfg: _Big) -> StageResult:
    """Writes `mib` MiB in 1 MiB pieces, as a checkpoint would; the disk may fill."""
    with (ctx.output_dir("blob") / "weights.bin").open("wb") as f:
        for _ in range(cfg.mib):
            if FULL["left"] > 0 and f.tell() + 2**20 > FULL["left"]:
                raise OSError(errno.ENOSPC, "No space left on device", str(f.name))
            f.write(b"\0" * 2**20)
    return StageResult(tables={"rows": pa.table({"x": [1, 2, 3]})})


SPEC = """
run: {iterations: 2, seed: 0}
pipeline:
  source: {stage: t.source}
  big: {stage: t.big}
"""


def test_a_full_disk_is_one_line_leaves_nothing_and_the_run_resumes(spec_file, tmp_path):
    path, catalog = spec_file(SPEC), str(tmp_path / "catalog")
    FULL["left"] = 2 * 2**20 + 10  # room for two of the three pieces
    try:
        failed = CliRunner().invoke(app, ["run", path, "--catalog", catalog])
    finally:
        FULL["left"] = 0
    assert failed.exit_code == 1, failed.output
    line = failed.stderr.strip().splitlines()[-1]  # after the run's display
    assert "Traceback" not in failed.output
    assert line.startswith(f"error: catalog {catalog}: no space left on the device while 0:big wrote its result")
    assert "2.0 MiB written when it failed" in line and "MiB free now" in line and "run the same command" in line
    assert "it needs 2.0 MiB;" in line  # no earlier result of its node: what it had written
    assert not any(Path(catalog, "_staging").iterdir())  # nothing half-written left behind
    assert not any(k.name.startswith("t_big") for k in Path(catalog, "results").iterdir())
    resumed = CliRunner().invoke(app, ["run", path, "--catalog", catalog])
    assert resumed.exit_code == 0, resumed.output
    assert "stages ran" in resumed.output
    from catalog.store import Catalog

    assert verify(Catalog(catalog)) == []
    assert sum(k.startswith("t_big") for k in Catalog(catalog).result_keys()) == 2
    # a later step of the node that fills the disk names what the node's last result took
    FULL["left"] = 2 * 2**20 + 10
    try:
        again = CliRunner().invoke(app, ["run", path, "--catalog", catalog, "-o", "run.iterations=3"])
    finally:
        FULL["left"] = 0
    assert again.exit_code == 1 and "it needs about 3.0 MiB, what its last result took" in again.stderr
