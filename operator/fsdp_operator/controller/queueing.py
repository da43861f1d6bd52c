"""Queued trainings (spec.scheduling.queue): Kueue's Workload of each job, read into the status, and spec.suspend.

Kueue creates one Workload per queued job (owned by the job, labelled
with the job's uid) and owns the job's suspend (a PyTorchJob's
runPolicy.suspend, a TrainJob's spec.suspend): suspended at creation,
unsuspended on admission, suspended again on preemption. So the renderer
leaves that field out of a queued job, and the user's spec.suspend becomes
the Workload's spec.active instead, which is Kueue's documented way
to stop a workload (Kueue then evicts it: reason Deactivated) and to let it
queue again. Names and condition types are Kueue v0.17.0's
(apis/kueue/v1beta2/workload_types.go).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.contract import WORKLOAD_API_VERSION, WORKLOAD_KIND

from .. import backends
from .kube import KubeClient

Json = dict[str, Any]

# Kueue's integrations that manage our jobs, as queue_state's message names them.
KUEUE_INTEGRATIONS = " or ".join(b.kueue_integration for b in backends.REGISTRY.values())

# Workload condition types.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"


def owning_job(workload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The job ownerReference of a Workload, if it is a job of one of our backends."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") in backends.BY_KIND and ref.get("controller"):
            return ref
    return None


def trim_workload(workload: Mapping[str, Any]) -> Json:
    """The parts of a Workload the status and the suspend intent need."""
    meta = workload.get("metadata") or {}
    return {
        "metadata": {k: copy.deepcopy(meta[k]) for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
        "spec": {k: v for k, v in (workload.get("spec") or {}).items() if k in ("active", "queueName")},
        "status": {"conditions": copy.deepcopy(((workload.get("status") or {}).get("conditions")) or [])},
    }


def is_active(workload: Mapping[str, Any]) -> bool:
    """spec.active (Kueue defaults it to true)."""
    return (workload.get("spec") or {}).get("active") is not False


@dataclass(frozen=True)
class QueueState:
    """What the Workload says: admitted or not, why, and the last eviction."""

    admitted: bool
    reason: str
    message: str
    evicted: Json | None = None  # the Workload's Evicted condition, when it has one


def queue_state(workload: Mapping[str, Any] | None, queue: str) -> QueueState:
    """The training's queue state from its Workload (None: Kueue has not made one yet)."""
    if workload is None:
        return QueueState(
            False,
            "NoWorkload",
            f"waiting for Kueue to create the job's Workload in LocalQueue {queue} "
            f"(Kueue must run with the integration of the job's kind: {KUEUE_INTEGRATIONS})",
        )
    conds = {c.get("type", ""): c for c in (workload.get("status") or {}).get("conditions") or []}
    evicted = conds.get(EVICTED)
    admitted = conds.get(ADMITTED)
    if admitted is not None and admitted.get("status") == "True":
        return QueueState(True, str(admitted.get("reason") or ADMITTED), str(admitted.get("message") or ""), evicted)
    if evicted is not None and evicted.get("status") == "True":
        reason = str(evicted.get("reason") or EVICTED)
        return QueueState(False, reason, f"{reason}: {evicted.get('message') or ''}".rstrip(": "), evicted)
    # Why it waits: QuotaReserved=False says which quota is short, or why the queue cannot admit it.
    pending = conds.get(QUOTA_RESERVED)
    if pending is not None and pending.get("status") == "False":
        return QueueState(False, str(pending.get("reason") or "Pending"), str(pending.get("message") or ""), evicted)
    if pending is not None:
        return QueueState(False, "QuotaReserved", str(pending.get("message") or ""), evicted)
    return QueueState(False, "Pending", f"queued in LocalQueue {queue}; Kueue has not evaluated it yet", evicted)


async def set_active(client: KubeClient, workload: Mapping[str, Any], active: bool) -> Json:
    """Kueue's stop and resume: spec.active false evicts the workload (Deactivated), true requeues it."""
    meta = workload["metadata"]
    return await client.merge_patch(
        WORKLOAD_API_VERSION, WORKLOAD_KIND, meta["namespace"], meta["name"], {"spec": {"active": active}}
    )
