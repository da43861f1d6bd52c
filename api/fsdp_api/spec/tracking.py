"""The tracking section: experiment trackers that rank 0 logs the training's series to.

Each tracker is a field of its own here and a module of its own in the trainer
(``fsdp_trainer/tracking/``); the trainer writes to them from a background
thread, so a slow or absent tracker never slows a step.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field

from ..base import ApiModel
from ..contract import TENSORBOARD_SUBDIR
from ..rules import Rule

# A server address: the scheme, a host (and port), any path; no whitespace anywhere.
MLFLOW_URI_PATTERN = r"^https?://[^\s/?#]+\S*$"


class TensorBoardSpec(ApiModel):
    """TensorBoard event files, written by rank 0 under the checkpoint directory, so they persist with it."""

    flush_seconds: int = Field(
        30,
        ge=1,
        le=600,
        description=(
            f"How often the event file is written out to <checkpoint.dir>/{TENSORBOARD_SUBDIR}, "
            "and so how late TensorBoard sees new points."
        ),
    )


class MlflowSpec(ApiModel):
    """An MLflow tracking server that rank 0 logs one run per training to."""

    uri: str = Field(
        min_length=8,
        max_length=2048,
        description=(
            "The tracking server's address, http:// or https:// (e.g. http://mlflow.mlflow.svc:5000). "
            "Credentials come from a Secret through spec.env: MLFLOW_TRACKING_TOKEN, or "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD."
        ),
    )
    experiment: str = Field(
        min_length=1,
        max_length=500,
        description="The experiment the run belongs to; created when the server has none of that name.",
    )
    run_name: str | None = Field(
        None,
        min_length=1,
        max_length=250,
        description="The run's display name (default: the FSDPTraining's name).",
    )
    flush_seconds: int = Field(
        10,
        ge=1,
        le=600,
        description="How often the points gathered since the last request are sent, in one request.",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            # CEL string literals take backslashes escaped.
            cel="self.uri.matches('" + MLFLOW_URI_PATTERN.replace("\\", "\\\\") + "')",
            message=(
                "uri must be the tracking server's http:// or https:// address with a host and no spaces, "
                "e.g. http://mlflow.mlflow.svc:5000"
            ),
            field_path=".uri",
            check=lambda m: re.search(MLFLOW_URI_PATTERN, m.uri) is not None,
        ),
    )


class TrackingSpec(ApiModel):
    """Experiment trackers (docs/tracking.md); none by default."""

    tensorboard: TensorBoardSpec | None = Field(
        None,
        description=(
            f"Write TensorBoard event files to <checkpoint.dir>/{TENSORBOARD_SUBDIR}; a resumed training "
            "continues the same run, each step once."
        ),
    )
    mlflow: MlflowSpec | None = Field(
        None,
        description=(
            "Log to an MLflow tracking server: one run per training, which a resumed training continues, "
            "each step once (docs/tracking.md)."
        ),
    )
    queue_points: int = Field(
        10_000,
        ge=100,
        le=1_000_000,
        description=(
            "Points that may wait for the trackers' background writer. When it falls behind that far, "
            "new points are dropped and counted (fsdp_tracker_points_dropped_total): training never waits."
        ),
    )

    @property
    def enabled(self) -> bool:
        return self.tensorboard is not None or self.mlflow is not None
