"""What one status computation reads: the training's own facts, the apply outcome, and the phases' groups."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.memory_plan import MemoryPlan
from fsdp_api.spec import CheckpointSpec, ResourcesSpec
from fsdp_api.status import Phase

from ...backends import JobView
from ..nodes.health import NodeHealth
from ..queueing import QueueState
from ..stall import StallVerdict
from .pod_report import Scheduling, Start

Json = Mapping[str, Any]


@dataclass(frozen=True)
class TrainingFacts:
    """What the status needs from the FSDPTraining object itself."""

    name: str
    namespace: str
    uid: str
    generation: int
    suspend: bool
    nodes: int
    gpus: int
    checkpoint_dir: str
    checkpoint_claim: str | None
    checkpoint_remote: str | None = None
    max_steps: int | None = None
    queue: str | None = None  # spec.scheduling.queue: Kueue owns the job's suspension

    @classmethod
    def from_body(cls, body: Json) -> TrainingFacts:
        """Read the facts leniently: defaults come from the API model, never a validation error.

        Status must be computable even for a spec the renderer rejects, so
        this does not validate the whole spec.
        """
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        resources = spec.get("resources") or {}
        checkpoint = spec.get("checkpoint") or {}
        max_steps = (spec.get("training") or {}).get("maxSteps")
        nodes = int(resources.get("nodes", ResourcesSpec.model_fields["nodes"].default))
        gpus_per_node = int(resources.get("gpusPerNode", ResourcesSpec.model_fields["gpus_per_node"].default))
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            suspend=bool(spec.get("suspend", False)),
            nodes=nodes,
            gpus=nodes * gpus_per_node,
            checkpoint_dir=str(checkpoint.get("dir", CheckpointSpec.model_fields["dir"].default)),
            checkpoint_claim=checkpoint.get("claimName"),
            checkpoint_remote=checkpoint.get("remote"),
            max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
            queue=(spec.get("scheduling") or {}).get("queue"),
        )


@dataclass(frozen=True)
class ReconcileOutcome:
    """Result of the last attempt to apply the rendered objects (the Reconciled condition)."""

    ok: bool
    reason: str
    message: str = ""


TERMINAL: tuple[Phase, ...] = ("Failed", "Succeeded")
ACTIVE: tuple[Phase, ...] = ("Restarting", "Running")
# Phases in which pods are expected to be (or become) scheduled: a placement
# problem is the most useful thing the status can say then.
WAITING: tuple[Phase, ...] = ("Pending", "Created", "Restarting", "Running")
# Phases in which the job has no pods: conditions about pods go until it runs again.
PODLESS: tuple[Phase, ...] = ("Suspended", "Queued")


@dataclass(frozen=True)
class Inputs:
    """What one status computation reads: compute_status's arguments, read once."""

    training: TrainingFacts
    job: JobView | None
    previous: Json
    prev_conds: Mapping[str, Json]
    generation: int | None  # the generation the job was rendered from (else the previous status')
    now: str
    outcome: ReconcileOutcome | None = None
    scheduling: Scheduling | None = None
    rejection: str | None = None
    start: Start | None = None
    stall: StallVerdict | None = None
    memory: MemoryPlan | None = None
    queue: QueueState | None = None
    nodes: NodeHealth | None = None
    # Known once the early conditions are built (the phase depends on them).
    phase: Phase = "Pending"
