"""The spec's `tracking:` section: which experiment trackers receive a run, and where
(`pipelines.run.tracking` sends them its metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.config import param


@dataclass(frozen=True)
class MlflowSettings:
    """`tracking.mlflow:` — where the run goes in MLflow."""

    uri: str = param("sqlite:///mlruns/mlflow.db", "tracking URI: a database, a server (http://...), ...")
    experiment: str = param("starpo", "experiment name (created when missing)")
    artifacts: str | None = param(
        None,
        "artifact location of a new experiment (None: mlruns/artifacts for a "
        "local database, the server's default otherwise)",
    )


@dataclass(frozen=True)
class WandbSettings:
    """`tracking.wandb:` — where the run goes in W&B."""

    project: str = param("starpo", "W&B project")
    entity: str | None = param(None, "W&B entity (None: your default)")
    mode: Literal["offline", "online"] = param("offline", "offline: files under dir, `wandb sync` uploads them")
    dir: str = param(".", "folder W&B writes its wandb/ folder into")


@dataclass(frozen=True)
class TrackingSection:
    """`tracking:` — experiment trackers that receive the run (see `pipelines.run.tracking`)."""

    tensorboard: str | None = param(None, "folder of TensorBoard runs: event files go to <folder>/<run>/")
    mlflow: MlflowSettings | None = param(None, "MLflow settings ({} for the defaults)")
    wandb: WandbSettings | None = param(None, "W&B settings ({} for the defaults)")
