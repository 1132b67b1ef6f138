"""Experiment tracking: what a run writes to TensorBoard, MLflow and W&B, read back
with each tool's own reader (skipped, saying why, where a tool is not installed)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import tests.pipelines.run.test_watch  # noqa: F401  (registers the stage t.signal)
from common.errors import UserError
from tests.conftest import run_spec

SPEC = """
run: {{iterations: 6, seed: 1}}
tracking: {tracking}
pipeline:
  init: {{stage: t.init, once: true}}
  s: {{stage: t.signal}}
"""


def _run(spec_file, catalog, tracking: str):
    return run_spec(spec_file(SPEC.format(tracking=tracking)), catalog)


def test_tensorboard_gets_every_metric_by_iteration_the_spec_warnings_and_report(spec_file, catalog, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[tracking]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(spec_file, catalog, f"{{tensorboard: '{tmp_path / 'tb'}'}}")
    folder = tmp_path / "tb" / "spec"
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    entropy = [(e.step, round(e.value, 3)) for e in events.Scalars("actor/entropy")]
    assert entropy == [(0, 1.0), (1, 1.1), (2, 0.9), (3, 1.0), (4, 0.2), (5, 0.1)]
    assert [e.step for e in events.Scalars("once/init/perf/seconds")] == [0]
    texts = events.Tags()["tensors"]
    assert {"spec/text_summary", "warnings/text_summary", "status/text_summary"} <= set(texts)
    warning = events.Tensors("warnings/text_summary")[0]
    assert warning.step == 4 and b"entropy" in warning.tensor_proto.string_val[0]
    assert (folder / "report.html").exists()


def test_mlflow_gets_metrics_parameters_warnings_report_and_status(spec_file, catalog, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e '.[tracking]')")
    pytest.importorskip("sqlalchemy", reason="mlflow's local database needs sqlalchemy (pip install -e '.[tracking]')")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    (tmp_path / "ml").mkdir()
    _run(spec_file, catalog, f"{{mlflow: {{uri: '{uri}', experiment: tests, artifacts: '{tmp_path / 'ml' / 'art'}'}}}}")
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.run_name == "spec" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "actor/entropy")
    assert [(m.step, round(m.value, 3)) for m in history] == [
        (0, 1.0),
        (1, 1.1),
        (2, 0.9),
        (3, 1.0),
        (4, 0.2),
        (5, 0.1),
    ]
    assert run.data.params["run.iterations"] == "6" and run.data.params["pipeline.s.stage"] == "t.signal"
    assert "entropy" in run.data.tags["warning.4.entropy_drop"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"warnings.txt", "report"} <= artifacts
    assert "report/report.html" in {a.path for a in client.list_artifacts(run.info.run_id, "report")}


def _wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (`run-<id>.wandb`): a 7-byte header,
    then LevelDB-style log blocks of 32 KiB, each record chunk with a 7-byte header
    (checksum, length, type: full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, records, partial = path.read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            pos += 32768 - pos % 32768
            continue
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(partial)
            records.append(record)
            partial = b""
    return records


def test_wandb_offline_gets_history_config_warnings_report_and_exit_code(spec_file, catalog, tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[tracking]')")
    import json

    _run(spec_file, catalog, f"{{wandb: {{project: tests, dir: '{tmp_path / 'wb'}'}}}}")
    (path,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(path)
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            history.append(items)
    entropy = [(h["_step"], round(h["actor/entropy"], 3)) for h in history if "actor/entropy" in h]
    assert entropy == [(0, 1.0), (1, 1.1), (2, 0.9), (3, 1.0), (4, 0.2), (5, 0.1)]
    assert any("once/init/perf/seconds" in h for h in history)
    assert any(h.get("_step") == 4 and "entropy" in h.get("warning", "") for h in history)
    (run_record,) = [r for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in run_record.run.config.update}
    assert config["run"]["iterations"] == 6
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "artifact" in kinds  # the report
    (exit_record,) = [r for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit.exit_code == 0


def test_an_unreachable_tracker_is_one_line_before_anything_runs(spec_file, catalog):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e '.[tracking]')")
    with pytest.raises(UserError, match=r"tracking\.mlflow: cannot reach"):
        _run(spec_file, catalog, "{mlflow: {uri: 'mysql://nobody@127.0.0.1:1/none'}}")
