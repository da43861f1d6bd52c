"""Queueing with Kueue and the job's deadlines."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..contract import TOPOLOGY_LEVELS
from ..rules import Rule
from .values import LABEL_VALUE_PATTERN, QUALIFIED_NAME_PATTERN

_SHORT_LEVELS = ", ".join(f"{short} ({label})" for short, label in TOPOLOGY_LEVELS.items())


class TopologySpec(ApiModel):
    """Where Kueue puts the pods: inside one domain of a node label (docs/kueue.md#topology)."""

    level: str = Field(
        min_length=1,
        # Kueue keeps the level in the Workload's topologyRequest, at most 63 characters.
        max_length=63,
        pattern=QUALIFIED_NAME_PATTERN,
        description=(
            "The node label whose value names a domain (a Topology level of the queue's ResourceFlavor), "
            f"or a short name: {_SHORT_LEVELS}."
        ),
    )
    mode: Literal["required", "preferred"] = Field(
        default="required",
        description=(
            "required: the job waits until one domain has room for every pod; preferred: as few domains as "
            "Kueue can find, going up the Topology's levels, spread if nothing else fits."
        ),
    )

    def node_label(self) -> str:
        """The node label key the level names."""
        return TOPOLOGY_LEVELS.get(self.level, self.level)


class SchedulingSpec(ApiModel):
    """Queueing on a shared cluster with Kueue (docs/kueue.md)."""

    queue: str | None = Field(
        default=None,
        # "" matches the label-value pattern, but Kueue reads an empty queue name as no queue: the job
        # would run at once while the training waits for a LocalQueue "".
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description=(
            "Kueue LocalQueue in the training's namespace that admits the job (the kueue.x-k8s.io/queue-name "
            "label). The job is then created suspended and Kueue decides when it runs; unset: no queueing."
        ),
    )
    priority_class: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description=(
            "Kueue WorkloadPriorityClass of the job (the kueue.x-k8s.io/priority-class label): orders the queue "
            "and decides who preempts whom. The pods' own PriorityClass is pod.priorityClassName."
        ),
    )
    topology: TopologySpec | None = Field(
        default=None,
        description=(
            "Kueue's topology-aware scheduling: the pods in one domain (an EKS network layer, a zone, a "
            "rack), placed in pod-index order. Needs queue, a ResourceFlavor "
            "with a Topology, and resources.instanceTypes; unset: Kueue places by quota only."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.priorityClass) || has(self.queue)",
            message="priorityClass is Kueue's: set queue too",
            field_path=".priorityClass",
            check=lambda s: s.priority_class is None or s.queue is not None,
        ),
        Rule(
            cel="!has(self.topology) || has(self.queue)",
            message="topology is placed by Kueue: set queue too",
            field_path=".topology",
            check=lambda s: s.topology is None or s.queue is not None,
        ),
    )


class RunPolicySpec(ApiModel):
    """Deadlines of the whole job (the PyTorchJob's runPolicy)."""

    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description=(
            "Seconds after the job starts before the training operator fails it and deletes its running pods; "
            "unset: no deadline. Set it above the expected run time (plus restarts)."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description=(
            "Seconds after the job finishes before the training operator deletes it and its pods "
            "(the FSDPTraining, its status and the checkpoints stay); unset: kept until the FSDPTraining is deleted."
        ),
    )
