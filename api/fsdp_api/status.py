"""The ``FSDPTraining`` status, as the operator writes it.

Declared in the CRD schema field by field, so the API server never prunes what
the operator stores and ``kubectl explain fsdptraining.status`` documents it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel

Phase = Literal["Pending", "Queued", "Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]


# The address of one tracker's run, as the trainer reports it; a longer one is not copied into the status.
MAX_RUN_PAGE_LENGTH = 2048
RunPage = Annotated[str, Field(max_length=MAX_RUN_PAGE_LENGTH, description="The run's page in that tracker.")]


class Condition(ApiModel):
    """A condition in the metav1.Condition shape."""

    type: str = Field(min_length=1, description="Condition type, e.g. Created, Running, Succeeded, Failed, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the FSDPTraining this condition was computed from."
    )
    last_transition_time: str = Field(description="When the condition last changed status (RFC 3339).")
    reason: str = Field(min_length=1, description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable details.")


class ReplicaStatus(ApiModel):
    """Pod counts of one PyTorchJob replica type; a TrainJob's child-Job counts of one replicated job."""

    active: int = Field(default=0, ge=0, description="Running pods.")
    succeeded: int = Field(default=0, ge=0, description="Pods that completed successfully.")
    failed: int = Field(default=0, ge=0, description="Pods that failed.")


class CheckpointStatus(ApiModel):
    """Where checkpoints go and whether they survive the pods."""

    dir: str | None = Field(default=None, description="Checkpoint directory in the pods.")
    ephemeral: bool = Field(
        default=True,
        description=(
            "True when neither a PVC nor a remote tier is set: checkpoints are lost with the pods and resume "
            "cannot work."
        ),
    )
    last_step: int | None = Field(
        default=None, ge=0, description="Step of the newest complete checkpoint seen in metrics."
    )
    remote: str | None = Field(
        default=None, description="spec.checkpoint.remote: the S3 location checkpoints are copied to."
    )
    last_uploaded_step: int | None = Field(
        default=None, ge=0, description="Step of the newest checkpoint committed to the remote tier, seen in metrics."
    )


class RouterStatus(ApiModel):
    """A mixture-of-experts model's worst MoE layer in the trainer's last metrics (docs/metrics.md, Router health)."""

    layer: str = Field(max_length=16, description="The layer's number in the model (the series' layer label).")
    max_load_ratio: float = Field(
        ge=0, description="Tokens of the layer's most-loaded expert over the mean per expert, last step (1: even)."
    )
    unused_experts_ratio: float = Field(
        ge=0, le=1, description="Share of the layer's experts that got no token in the last step."
    )
    collapsed: bool = Field(
        default=False,
        description=(
            "More than half of the layer's experts got no token: the router sends every token to a few "
            "(the FSDPTrainingRouterCollapsed alert's signal)."
        ),
    )


class ExcludedNode(ApiModel):
    """A node this training excluded (spec.health.onSuspectNode exclude)."""

    node: str = Field(max_length=253, description="The node's name.")
    reason: str = Field(max_length=1024, description="The evidence that made it a suspect.")
    time: str = Field(description="When it was excluded (RFC 3339).")
    until: str = Field(description="When the operator lifts its taint (RFC 3339).")


class NodeIncidents(ApiModel):
    """What went wrong on one node across this training's restarts; repeated, it makes the node a suspect."""

    node: str = Field(max_length=253, description="The node's name.")
    failures: int = Field(
        default=0, ge=0, description="Times the trainer container of the training's pod on this node ended in an error."
    )
    stalls: int = Field(default=0, ge=0, description="Stalls whose stuck or lagging rank ran on this node.")
    last_failure_at: str | None = Field(
        default=None, description="When the newest counted failure ended (the container's finishedAt, RFC 3339)."
    )
    last: str = Field(max_length=1024, description="The newest incident, in words.")
    time: str = Field(description="When the newest incident was recorded (RFC 3339).")


class TopologyStatus(ApiModel):
    """Where Kueue's topology-aware scheduling put the pods (spec.scheduling.topology)."""

    level: str = Field(max_length=317, description="The node label of the domains.")
    domains: list[Annotated[str, Field(max_length=63, description="One domain: a value of the label.")]] = Field(
        default_factory=list,
        max_length=64,
        description="The values of that label on the assigned nodes: one domain unless the pods had to spread.",
    )


class MemoryStatus(ApiModel):
    """The spec's memory plan (``fsdp-operator plan``): estimated bytes per GPU against the GPU's memory."""

    estimated_bytes_per_gpu: int | None = Field(
        default=None, ge=0, description="Estimated peak memory per GPU, in bytes."
    )
    gpu_memory_bytes: int | None = Field(
        default=None, ge=0, description="Memory of one GPU of the smallest requested instance type, in bytes."
    )
    instance_type: str | None = Field(default=None, description="The instance type the estimate was compared with.")


class FSDPTrainingStatus(ApiModel):
    """Observed state of the job, mirrored from its PyTorchJob and its metrics."""

    phase: Phase = Field(default="Pending", description="Summary of the job's state.")
    message: str = Field(default="", description="Human-readable explanation of the phase.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec last reconciled into the PyTorchJob."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions in the metav1.Condition shape.")
    job_name: str | None = Field(default=None, description="Name of the PyTorchJob running this training.")
    nodes: int | None = Field(default=None, ge=0, description="Nodes (pods) requested.")
    gpus: int | None = Field(default=None, ge=0, description="GPUs requested in total.")
    replica_statuses: dict[str, ReplicaStatus] = Field(
        default_factory=dict,
        description=(
            "Pod counts per replica type (Worker) of a PyTorchJob; with backend trainjob, counts of the "
            "TrainJob's child Jobs per replicated job (node), from its jobsStatus."
        ),
    )
    start_time: str | None = Field(
        default=None, description="When the job started running (RFC 3339); a TrainJob: created or last resumed."
    )
    completion_time: str | None = Field(default=None, description="When the job finished (RFC 3339).")
    step: int | None = Field(default=None, ge=0, description="Latest optimizer step reported by the trainer's metrics.")
    loss: float | None = Field(default=None, description="Latest training loss reported by the trainer's metrics.")
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Latest global training throughput in tokens/s."
    )
    # Named as Kubeflow Trainer v2.3 names them in TrainJob.status.trainerStatus, so one reading serves both.
    progress_percentage: int | None = Field(
        default=None, ge=0, le=100, description="Share of spec.training.maxSteps trained, in percent (rounded down)."
    )
    estimated_remaining_seconds: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description=(
            "Steps left times the recent step time, while Running: an estimate that leaves out the time "
            "checkpoint saves and validation take."
        ),
    )
    remaining: str | None = Field(
        default=None,
        max_length=16,
        description="estimatedRemainingSeconds for people, e.g. 3h05m (kubectl get's column).",
    )
    tracker_runs: dict[str, RunPage] | None = Field(
        default=None,
        description=(
            "Where each experiment tracker (spec.tracking) shows this training's run, by tracker "
            "(mlflow: the run's page), once rank 0 has opened it."
        ),
    )
    router: RouterStatus | None = Field(
        default=None,
        description=(
            "A mixture-of-experts model: its worst MoE layer (most experts left without tokens, then the most "
            "uneven load) in the last metrics the operator read."
        ),
    )
    stall_restarts: int | None = Field(
        default=None,
        ge=0,
        description="Times the operator restarted the job's pods because it stalled (spec.stall.onStall).",
    )
    excluded_nodes: list[ExcludedNode] | None = Field(
        default=None,
        max_length=64,
        description=(
            "The nodes this training excluded as suspects, oldest first (spec.health.onSuspectNode exclude); "
            "their number is capped by spec.health.maxExcludedNodes."
        ),
    )
    node_incidents: list[NodeIncidents] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Per node, the trainer failures and stalls seen there across the training's restarts, newest "
            "last; a node with two or more, while it hosts the training's pods, is a suspect (NodesHealthy)."
        ),
    )
    checkpoint: CheckpointStatus = Field(
        default_factory=CheckpointStatus, description="Checkpoint location and durability."
    )
    topology: TopologyStatus | None = Field(
        default=None,
        description="The topology domains Kueue admitted the pods into, while admitted (spec.scheduling.topology).",
    )
    memory: MemoryStatus | None = Field(
        default=None,
        description="The memory plan of the spec (docs/memory-plan.md); the FitsMemory condition gives the verdict.",
    )
