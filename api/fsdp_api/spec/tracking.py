"""The tracking section: experiment trackers that rank 0 logs the training's series to.

Each tracker is a field of its own here and a module of its own in the trainer
(``fsdp_trainer/tracking/``); the trainer writes to them from a background
thread, so a slow or absent tracker never slows a step.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..contract import ENV_WANDB_API_KEY, TENSORBOARD_SUBDIR, WANDB_SUBDIR
from ..rules import Rule
from .env import KeySelector

# A server address: the scheme, a host (and port), any path; no whitespace anywhere.
SERVER_ADDRESS_PATTERN = r"^https?://[^\s/?#]+\S*$"
# What a server address must not carry: credentials before the host (user:password@) or a query
# (?token=...). Both would travel verbatim into the ConfigMap, the check's messages, the status
# and Events that every viewer of the namespace reads; credentials come from a Secret instead.
# Python's re.search and CEL's matches() both find it anywhere in the address.
CREDENTIALS_IN_ADDRESS = r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@|[?]"
# A W&B project or entity name: W&B refuses / \\ # ? % : in them (wandb/sdk/wandb_settings.py).
WANDB_NAME_PATTERN = r"^[^/\\#?%:]+$"


def _attr(field: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), field)


def _cel_literal(pattern: str) -> str:
    # CEL string literals take backslashes escaped.
    return "'" + pattern.replace("\\", "\\\\") + "'"


def server_address_rule(field: str, message: str, *, optional: bool = False) -> Rule:
    """A tracking server's address in ``field``: http(s), a host, no spaces."""
    attr = _attr(field)
    unset = f"!has(self.{field}) || " if optional else ""
    return Rule(
        cel=f"{unset}self.{field}.matches({_cel_literal(SERVER_ADDRESS_PATTERN)})",
        message=message,
        field_path=f".{field}",
        check=lambda m: getattr(m, attr) is None or re.search(SERVER_ADDRESS_PATTERN, getattr(m, attr)) is not None,
    )


def credential_free_rule(field: str, where_credentials_go: str, *, optional: bool = False) -> Rule:
    """No user:password@ and no ?query in the address in ``field``: one line naming where credentials go."""
    attr = _attr(field)
    unset = f"!has(self.{field}) || " if optional else ""
    return Rule(
        cel=f"{unset}!self.{field}.matches({_cel_literal(CREDENTIALS_IN_ADDRESS)})",
        message=(
            f"{field} must carry no credentials (no user:password@, no ?query): everyone who can read the "
            f"training sees its address; {where_credentials_go}"
        ),
        field_path=f".{field}",
        check=lambda m: getattr(m, attr) is None or re.search(CREDENTIALS_IN_ADDRESS, getattr(m, attr)) is None,
    )


class TensorBoardSpec(ApiModel):
    """TensorBoard event files, written by rank 0 under the checkpoint directory, so they persist with it."""

    flush_seconds: int = Field(
        default=30,
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
        default=None,
        min_length=1,
        max_length=250,
        description="The run's display name (default: the FSDPTraining's name).",
    )
    flush_seconds: int = Field(
        default=10,
        ge=1,
        le=600,
        description="How often the points gathered since the last request are sent, in one request.",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        server_address_rule(
            "uri",
            "uri must be the tracking server's http:// or https:// address with a host and no spaces, "
            "e.g. http://mlflow.mlflow.svc:5000",
        ),
        credential_free_rule(
            "uri",
            "give MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, "
            "from a Secret through spec.env",
        ),
    )


class WandbSpec(ApiModel):
    """A Weights & Biases run per training: online to a W&B server, or offline files under the checkpoint directory."""

    project: str = Field(
        min_length=1, max_length=128, pattern=WANDB_NAME_PATTERN, description="The W&B project the run belongs to."
    )
    entity: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=WANDB_NAME_PATTERN,
        description="The W&B team or user that owns the project (default: the API key's own).",
    )
    run_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The run's display name (default: the FSDPTraining's name).",
    )
    mode: Literal["online", "offline"] = Field(
        default="online",
        description=(
            "online: log to the W&B server. offline: write the run to "
            f"<checkpoint.dir>/{WANDB_SUBDIR} only, to upload later with `wandb sync` (no key, no network)."
        ),
    )
    api_key_secret: KeySelector | None = Field(
        default=None,
        description=(
            f"The Secret key holding the W&B API key, given to the trainer as {ENV_WANDB_API_KEY}; "
            "required online. A missing Secret or key is one line from the pod's check, before training starts."
        ),
    )
    base_url: str | None = Field(
        default=None,
        min_length=8,
        max_length=2048,
        description="A self-hosted W&B server's address, http:// or https:// (default: W&B's cloud).",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.mode == 'offline' || has(self.apiKeySecret)",
            message="online W&B needs apiKeySecret (the Secret key holding the API key), or mode: offline",
            field_path=".apiKeySecret",
            check=lambda m: m.mode == "offline" or m.api_key_secret is not None,
        ),
        server_address_rule(
            "baseUrl",
            "baseUrl must be the W&B server's http:// or https:// address with a host and no spaces",
            optional=True,
        ),
        credential_free_rule("baseUrl", "the API key comes from apiKeySecret", optional=True),
    )


class TrackingSpec(ApiModel):
    """Experiment trackers (docs/tracking.md); none by default."""

    tensorboard: TensorBoardSpec | None = Field(
        default=None,
        description=(
            f"Write TensorBoard event files to <checkpoint.dir>/{TENSORBOARD_SUBDIR}; a resumed training "
            "continues the same run, each step once."
        ),
    )
    mlflow: MlflowSpec | None = Field(
        default=None,
        description=(
            "Log to an MLflow tracking server: one run per training, which a resumed training continues, "
            "each step once (docs/tracking.md)."
        ),
    )
    wandb: WandbSpec | None = Field(
        default=None,
        description=(
            "Log to Weights & Biases: one run per training, which a resumed training continues, each step once "
            "(docs/tracking.md)."
        ),
    )
    queue_points: int = Field(
        default=10_000,
        ge=100,
        le=1_000_000,
        description=(
            "Points that may wait for the trackers' background writer. When it falls behind that far, "
            "new points are dropped and counted (fsdp_tracker_points_dropped_total): training never waits."
        ),
    )

    @property
    def enabled(self) -> bool:
        return any(getattr(self, name) is not None for name in TRACKER_FIELDS)


# spec.tracking's trackers, one field each (the trainer's registry has one module per name).
TRACKER_FIELDS = ("tensorboard", "mlflow", "wandb")
