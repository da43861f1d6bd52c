"""The stall section: when a training counts as stalled, and what happens then."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel


class StallSpec(ApiModel):
    """When a training counts as stalled (no new optimizer step for too long) and what happens then.

    The operator times the steps it reads from the trainer's metrics; the
    trainer has its own in-process watchdog for a single step.
    """

    on_stall: Literal["alert", "restart"] = Field(
        default="alert",
        description=(
            "alert: set the Stalled condition and post an Event; restart: also delete the job's pods "
            "so that they are re-created and resume from the last checkpoint (at most maxRestarts times)."
        ),
    )
    step_time_factor: float = Field(
        default=10.0,
        ge=2,
        le=1000,
        description="Stalled when no new step for this many times the recent step time (and at least minSeconds).",
    )
    min_seconds: int = Field(default=300, ge=5, le=86400, description="Floor of the no-new-step limit, in seconds.")
    startup_seconds: int = Field(
        default=1800,
        ge=5,
        le=86400,
        description="Allowance for the first steps after a start or restart (model and checkpoint loading).",
    )
    checkpoint_seconds: int = Field(
        default=1800,
        ge=0,
        le=86400,
        description="Extra allowance after a step that saves a checkpoint or runs validation.",
    )
    max_restarts: int = Field(
        default=3, ge=0, le=100, description="onStall restart: restarts for stalls before the operator only alerts."
    )
    trainer_step_timeout_seconds: int = Field(
        default=1800,
        ge=0,
        le=604800,
        description=(
            "The trainer's own watchdog: a rank whose step takes longer (plus startupSeconds for the first "
            "step, checkpointSeconds for a save or validation) writes every thread's stack to its log and to "
            "<checkpoint.dir>/stalls/, then exits so that it is restarted; 0 disables it."
        ),
    )
