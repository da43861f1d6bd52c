"""The checkpoint section: distributed checkpoints and resume."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..contract import CHECKPOINT_DIR_PREFIX, POD_MOUNTS
from ..rules import Rule, applies_only_when
from .object_refs import MAX_REFERENCE_LENGTH, s3_form_rule
from .path_rules import no_dot_segments_rule


class CheckpointSpec(ApiModel):
    """Distributed checkpoints (torch.distributed.checkpoint) and resume."""

    dir: str = Field(
        default="/checkpoints",
        max_length=4096,
        pattern=r"^(/[^/]+)+$",
        description="Absolute directory for checkpoints inside the pod (no trailing slash).",
    )
    interval_steps: int = Field(
        default=500, ge=1, description="Steps between checkpoints (one is always written at the end)."
    )
    keep_last: int = Field(
        default=3, ge=1, le=1000, description="Complete checkpoints to keep; older ones are deleted."
    )
    claim_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description=(
            "PersistentVolumeClaim mounted at dir. Unset: checkpoints live in an emptyDir and are lost "
            "with the pod, and when it finishes (the status says so)."
        ),
    )
    resume: Literal["auto", "never"] = Field(
        default="auto",
        description="auto: resume from the newest complete checkpoint in dir; never: always start fresh.",
    )
    resume_from: str | None = Field(
        default=None,
        max_length=MAX_REFERENCE_LENGTH,
        pattern=r"^((/[^/]+)+|s3://.+)$",
        description=(
            "Another training's checkpoints to start from while dir (and remote) hold none of this training's "
            "own: a step folder (.../step-00000300) or a checkpoint dir (its newest complete step), mounted in "
            "the pod (spec.volumes); or another training's checkpoint.remote (s3://bucket/prefix: its newest "
            "committed step, or .../step-00000300), downloaded into dir first. The run continues that training "
            "exactly (weights, optimizer, schedule, data "
            "position, step) and writes its checkpoints to dir, which later restarts resume from; the source is "
            "only read. Its data section and seqLen must be this training's."
        ),
    )
    async_save: bool = Field(default=False, description="Save checkpoints asynchronously, overlapping the next steps.")
    remote: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
        description=(
            "s3://bucket[/prefix]: a remote tier. Every checkpoint committed in dir is also uploaded there in the "
            "background, committed by a manifest written last; resume takes the newest complete step of either "
            "tier. Credentials come from the pod's service account (EKS Pod Identity or IRSA); an S3-compatible "
            "store is reached through AWS_ENDPOINT_URL_S3 in spec.env."
        ),
    )
    remote_keep_last: int = Field(
        default=3, ge=1, le=1000, description="Committed checkpoints to keep in remote; older ones are deleted there."
    )
    remote_wait_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description=(
            "How long a finished training waits for its last checkpoint to be committed to remote; past it, the "
            "trainer exits with an error (the restart uploads the local copy), so Succeeded means it is there."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        s3_form_rule("remote"),
        Rule(
            # A bucket name has no "/": any match is in the prefix.
            cel=f"!has(self.remote) || !self.remote.matches('/{CHECKPOINT_DIR_PREFIX}[0-9]')",
            message=(
                f"remote must have no segment named like a checkpoint step ({CHECKPOINT_DIR_PREFIX}N): a training "
                "whose prefix holds it would take it for an uncommitted step of its own and delete it at start"
            ),
            field_path=".remote",
            check=lambda c: c.remote is None or re.search(f"/{CHECKPOINT_DIR_PREFIX}[0-9]", c.remote) is None,
        ),
        Rule(
            cel="!has(self.resumeFrom) || !has(self.resume) || self.resume == 'auto'",
            message="resumeFrom needs resume: auto (never always starts fresh)",
            field_path=".resumeFrom",
            check=lambda c: c.resume_from is None or c.resume == "auto",
        ),
        Rule(
            cel=(
                "!has(self.resumeFrom) || (self.resumeFrom != (has(self.dir) ? self.dir : '/checkpoints') && "
                "!self.resumeFrom.startsWith((has(self.dir) ? self.dir : '/checkpoints') + '/'))"
            ),
            message=(
                "resumeFrom must not be inside dir: this training's own checkpoints are resumed from anyway; to start "
                "again from an earlier step, give the new run a dir of its own"
            ),
            field_path=".resumeFrom",
            check=lambda c: (
                c.resume_from is None or not (c.resume_from == c.dir or c.resume_from.startswith(c.dir + "/"))
            ),
        ),
        s3_form_rule("resumeFrom", "resume_from"),
        Rule(
            # remote may end in "/" (s3://bucket/prefix/): compared as the directory it names.
            cel=(
                "!has(self.resumeFrom) || !has(self.remote) || (self.resumeFrom != self.remote && "
                "self.resumeFrom + '/' != self.remote && "
                "!self.resumeFrom.startsWith(self.remote.endsWith('/') ? self.remote : self.remote + '/'))"
            ),
            message=(
                "resumeFrom must not be inside remote: this training's own steps there are resumed from anyway; to "
                "start again from an earlier step, give the new run a remote of its own"
            ),
            field_path=".resumeFrom",
            check=lambda c: (
                c.resume_from is None
                or c.remote is None
                or not (
                    c.resume_from.rstrip("/") == c.remote.rstrip("/")
                    or c.resume_from.startswith(c.remote.rstrip("/") + "/")
                )
            ),
        ),
        no_dot_segments_rule("resumeFrom", "resume_from", also_takes_urls=True),
        no_dot_segments_rule("dir"),
        Rule(
            cel=(
                "!has(self.dir) || ![" + ", ".join(f"'{m}'" for m in POD_MOUNTS) + "]"
                ".exists(m, m == self.dir || m.startsWith(self.dir + '/'))"
            ),
            message=(
                "dir must not be a directory the pod already mounts ("
                + ", ".join(POD_MOUNTS)
                + ") nor a parent of one: the checkpoint volume would hide it"
            ),
            field_path=".dir",
            check=lambda c: not any(m == c.dir or m.startswith(c.dir + "/") for m in POD_MOUNTS),
        ),
    )


# After the class: the rules read its fields' names and defaults.
CheckpointSpec.rules = (
    *CheckpointSpec.rules,
    *(
        applies_only_when(CheckpointSpec, attr, "has(self.remote)", lambda c: c.remote is not None, "checkpoint.remote")
        for attr in ("remote_keep_last", "remote_wait_seconds")
    ),
)
