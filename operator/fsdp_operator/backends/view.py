"""A job as the status reads it: one typed view, whatever its backend.

Every backend's ``kubeflow_v1_view`` says its job in the Kubeflow v1
vocabulary (``reconcile.trim_job`` keeps that form in memory); ``JobView.of``
reads it once, so ``controller/status/compute.py`` deals with fields instead of
``.get`` chains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdp_api.status import ReplicaStatus


@dataclass(frozen=True)
class JobCondition:
    """One of the job's conditions (Kubeflow's JobCondition): status True, False or Unknown."""

    type: str
    status: str
    reason: str
    message: str
    transition_time: str | None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> JobCondition:
        status = raw.get("status")
        return cls(
            type=str(raw.get("type", "")),
            status=str(status) if status in ("True", "False") else "Unknown",
            reason=str(raw.get("reason") or ""),
            message=str(raw.get("message") or ""),
            # The training operator sets lastUpdateTime where older versions lack the transition time.
            transition_time=raw.get("lastTransitionTime") or raw.get("lastUpdateTime"),
        )


@dataclass(frozen=True)
class JobView:
    """The parts of a job the status needs."""

    kind: str
    name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Suspend set in the job's spec (acknowledged or not by its controller).
    suspend_requested: bool = False
    conditions: tuple[JobCondition, ...] = ()
    # By replica type (PyTorchJob: pods; TrainJob: JobSet's child Jobs), sorted by type.
    replicas: Mapping[str, ReplicaStatus] = field(default_factory=dict)
    start_time: str | None = None
    completion_time: str | None = None

    @classmethod
    def of(cls, job: Mapping[str, Any], default_kind: str) -> JobView:
        """Read a job in the Kubeflow v1 form (a PyTorchJob, or a backend's ``kubeflow_v1_view``)."""
        meta = job.get("metadata") or {}
        status = job.get("status") or {}
        run_policy = (job.get("spec") or {}).get("runPolicy") or {}
        raw_replicas = status.get("replicaStatuses") or {}
        return cls(
            kind=str(job.get("kind") or default_kind),
            name=str(meta.get("name", "")),
            annotations=dict(meta.get("annotations") or {}),
            suspend_requested=bool(run_policy.get("suspend", False)),
            conditions=tuple(map(JobCondition.of, status.get("conditions") or [])),
            replicas={
                rtype: ReplicaStatus(
                    active=int(r.get("active") or 0),
                    succeeded=int(r.get("succeeded") or 0),
                    failed=int(r.get("failed") or 0),
                )
                for rtype, r in sorted(raw_replicas.items())
            },
            start_time=status.get("startTime"),
            completion_time=status.get("completionTime"),
        )

    def by_type(self) -> dict[str, JobCondition]:
        """The conditions by type (the last of a type wins)."""
        return {c.type: c for c in self.conditions}

    def true_conditions(self) -> dict[str, JobCondition]:
        """The conditions whose status is True, by type."""
        return {c.type: c for c in self.conditions if c.status == "True"}

    def active(self) -> int:
        """Active replicas over all replica types."""
        return sum(r.active for r in self.replicas.values())
