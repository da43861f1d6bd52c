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
from .pod_report import PodsReport, Scheduling, Start

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
class Observations:
    """What the controller saw or decided since the status was last written: one status computation's news.

    Each part left None keeps what the previous status says of it: ``outcome``, the
    result of an apply attempt (the Reconciled condition); ``scheduling``, ``start``
    and ``rejection``, what the pods say of their placement, their containers and the
    trainer's verdict on its config (Schedulable, PodsStarted, ConfigValid); ``stall``,
    the stall check's verdict and ``stall_restarts`` its restart count; ``memory``, the
    spec's memory plan, made when it is applied (FitsMemory, status.memory); ``queue``,
    what Kueue's Workload says of a queued training (Admitted, Evicted); ``nodes``,
    what the nodes under the pods say of themselves (NodesHealthy); ``excluded_nodes``
    and ``node_incidents``, the nodes the training excluded and the failures and stalls
    counted per node. ``now`` is the time the conditions are stamped with (the clock
    when None).
    """

    outcome: ReconcileOutcome | None = None
    scheduling: Scheduling | None = None
    rejection: str | None = None
    start: Start | None = None
    stall: StallVerdict | None = None
    stall_restarts: int | None = None
    memory: MemoryPlan | None = None
    queue: QueueState | None = None
    nodes: NodeHealth | None = None
    excluded_nodes: list[dict[str, Any]] | None = None
    node_incidents: list[dict[str, Any]] | None = None
    now: str | None = None

    @classmethod
    def of_pods(cls, report: PodsReport | None, **others: Any) -> Observations:
        """What one look at the pods says, with ``others`` beside it."""
        if report is None:
            return cls(**others)
        return cls(scheduling=report.scheduling, rejection=report.rejection, start=report.start, **others)


@dataclass(frozen=True)
class Inputs:
    """What one status computation reads: the training, its job, the previous status and the news, read once."""

    training: TrainingFacts
    job: JobView | None
    previous: Json
    prev_conds: Mapping[str, Json]
    generation: int | None  # the generation the job was rendered from (else the previous status')
    now: str
    seen: Observations
    # Known once the early conditions are built (the phase depends on them).
    phase: Phase = "Pending"
