"""Experiment tracking: a run's metrics in TensorBoard, MLflow or W&B, as runner hooks.

    tracking:
      tensorboard: runs/tb                  # event files under runs/tb/<run>/
      mlflow: {uri: sqlite:///mlruns/mlflow.db, experiment: starpo}
      wandb: {project: starpo, mode: offline}

Off by default; each tool is an optional extra (``pip install -e '.[tracking]'``).
What every tracker gets (`pipelines.run.hooks`):

- every metric, with the iteration as its step; a once-stage's metrics (warm start,
  first eval) as ``once/<node>/<metric>`` at step 0;
- the resolved spec as parameters (TensorBoard: as text; MLflow: one parameter per
  dotted key; W&B: the run's config);
- each early warning as an event (TensorBoard: text at its iteration; MLflow: a tag
  and ``warnings.txt``; W&B: ``warning`` text in the history at its iteration);
- the run report (`pipelines.report.page`) as an artifact when the run ends (TensorBoard:
  ``report.html`` beside the events), and how the run ended (finished, failed,
  interrupted: MLflow's FINISHED / FAILED / KILLED, W&B's exit code).

A tracker that cannot be reached fails the run at its start, with one line.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from common.errors import UserError
from pipelines.run.hooks import Event, Hooks, RunEnd, RunStart, StepEvent
from pipelines.spec.trackers import MlflowSettings, TrackingSection, WandbSettings


def flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{name}.")
        else:
            out[name] = value
    return out


class RunReport(Hooks):
    """The run report, written once when the first tracker asks for it and shared by
    all of them; its folder is removed after the trackers' `after_run` (this hook
    comes after them)."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog
        self.made: Path | None = None
        self.tried = False

    def folder(self, run: str) -> Path | None:
        """A folder holding ``report.html`` and its images (None when it cannot be made)."""
        from pipelines.report.page import write_report

        if not self.tried:
            self.tried = True
            folder = Path(tempfile.mkdtemp(prefix="run-report-"))
            try:
                write_report(self.catalog, [run], folder / "report.html")
                self.made = folder
            except Exception as exc:  # a courtesy at the end: its failure must not mask the run's status
                logging.getLogger(__name__).warning("tracking: no report for run %s: %s", run, exc)
                shutil.rmtree(folder, ignore_errors=True)
        return self.made

    def after_run(self, end: RunEnd) -> None:
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)


class Tracker(Hooks):
    """What the trackers share: once-stage metrics held until the first iteration's
    step, and the run's report (`RunReport`)."""

    def __init__(self, report: RunReport) -> None:
        self.reports = report
        self.once: dict[str, float] = {}
        self.run = ""

    def after_step(self, event: StepEvent) -> None:
        if event.iteration is None:
            self.once |= {f"once/{event.node}/{k}": float(v) for k, v in event.metrics.items()}

    def take_once(self) -> dict[str, float]:
        held, self.once = self.once, {}
        return held

    def report(self) -> Path | None:
        """The folder of the run's report (see `RunReport`)."""
        return self.reports.folder(self.run)


class TensorBoardHooks(Tracker):
    def __init__(self, folder: str, report: RunReport) -> None:
        super().__init__(report)
        self.folder = folder
        self.writer: Any = None

    def before_run(self, start: RunStart) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("tracking.tensorboard needs tensorboard: pip install -e '.[tracking]'") from None
        self.run = start.run
        self.writer = SummaryWriter(log_dir=str(Path(self.folder) / start.run))
        self.writer.add_text("spec", "```yaml\n" + start.spec_yaml + "\n```", 0)

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        for name, value in {**self.take_once(), **metrics}.items():
            self.writer.add_scalar(name, value, iteration)
        self.writer.flush()

    def on_warning(self, event: Event) -> None:
        self.writer.add_text("warnings", event.message, event.iteration)

    def after_run(self, end: RunEnd) -> None:
        if self.writer is None:
            return
        self.writer.add_text("status", f"{end.status} after {end.seconds:.0f} s {end.message}".strip(), 0)
        self.writer.close()
        report = self.report()
        if report is not None:
            shutil.copytree(report, self.writer.log_dir, dirs_exist_ok=True)


class MlflowHooks(Tracker):
    STATUS: ClassVar[dict[str, str]] = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}

    def __init__(self, settings: MlflowSettings, report: RunReport) -> None:
        super().__init__(report)
        self.settings = settings
        self.client: Any = None
        self.run_id = ""
        self.warnings: list[str] = []

    def before_run(self, start: RunStart) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise UserError("tracking.mlflow needs mlflow: pip install -e '.[tracking]'") from None
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database set-up notices
        uri, artifacts = self.settings.uri, self.settings.artifacts
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # relative: this folder
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            artifacts = artifacts or str(Path(uri.removeprefix("sqlite:///")).parent.resolve() / "artifacts")
        self.run = start.run
        try:
            self.client = MlflowClient(uri)
            found = self.client.get_experiment_by_name(self.settings.experiment)
            experiment = (
                found.experiment_id
                if found
                else self.client.create_experiment(self.settings.experiment, artifact_location=artifacts)
            )
            run = self.client.create_run(
                experiment, run_name=start.run, tags={"catalog": start.catalog, "spec_file": start.spec_file}
            )
        except Exception as exc:
            raise UserError(f"tracking.mlflow: cannot reach {uri}: {type(exc).__name__}: {exc}") from None
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in flatten(start.settings).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, iteration) for k, v in {**self.take_once(), **metrics}.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def on_warning(self, event: Event) -> None:
        self.warnings.append(f"iteration {event.iteration}: {event.message}")
        self.client.set_tag(self.run_id, f"warning.{event.iteration}.{event.rule}", event.message)
        self.client.log_text(self.run_id, "\n".join(self.warnings) + "\n", "warnings.txt")

    def after_run(self, end: RunEnd) -> None:
        if self.client is None:
            return
        report = self.report()
        if report is not None:
            self.client.log_artifacts(self.run_id, str(report), "report")
        if end.message:
            self.client.set_tag(self.run_id, "stopped", end.message)
        self.client.set_terminated(self.run_id, self.STATUS[end.status])


class WandbHooks(Tracker):
    def __init__(self, settings: WandbSettings, report: RunReport) -> None:
        super().__init__(report)
        self.settings = settings
        self.wb: Any = None

    def before_run(self, start: RunStart) -> None:
        try:
            import wandb
        except ImportError:
            raise UserError("tracking.wandb needs wandb: pip install -e '.[tracking]'") from None
        os.environ.setdefault("WANDB_SILENT", "true")  # no banner in the run's display
        self.run = start.run
        s = self.settings
        Path(s.dir).mkdir(parents=True, exist_ok=True)
        try:
            self.wb = wandb.init(
                project=s.project,
                entity=s.entity,
                name=start.run,
                mode=s.mode,
                dir=s.dir,
                config=dict(start.settings),
                reinit="create_new",
            )
        except Exception as exc:
            raise UserError(f"tracking.wandb: cannot start a run ({s.mode}): {type(exc).__name__}: {exc}") from None

    def after_iteration(self, iteration: int, metrics: Mapping[str, float], latest: Mapping[str, float]) -> None:
        self.wb.log({**self.take_once(), **metrics}, step=iteration)

    def on_warning(self, event: Event) -> None:
        self.wb.log({"warning": event.message}, step=event.iteration)

    def after_run(self, end: RunEnd) -> None:
        if self.wb is None:
            return
        import wandb

        report = self.report()
        if report is not None:
            artifact = wandb.Artifact(f"report-{self.run}", type="report")
            artifact.add_dir(str(report))
            self.wb.log_artifact(artifact)
        self.wb.summary["status"] = end.status
        self.wb.finish(exit_code=0 if end.status == "finished" else 1)


def tracking_hooks(section: TrackingSection, catalog: Any) -> list[Hooks]:
    """The hooks of the trackers `section` turns on."""
    report = RunReport(catalog)
    hooks: list[Hooks] = []
    if section.tensorboard is not None:
        hooks.append(TensorBoardHooks(section.tensorboard, report))
    if section.mlflow is not None:
        hooks.append(MlflowHooks(section.mlflow, report))
    if section.wandb is not None:
        hooks.append(WandbHooks(section.wandb, report))
    return [*hooks, report] if hooks else []
