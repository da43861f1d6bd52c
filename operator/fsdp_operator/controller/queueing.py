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

Kueue manages only the kinds whose integration its configuration enables
(``integrations.frameworks``); since v0.19 kubeflow.org/pytorchjob is not among
the defaults. A job of another kind passes its webhook unsuspended and would run
at once, outside its queue. So a queued job that comes back from its creation
unsuspended is suspended by the operator and marked (KUEUE_HOLD_ANNOTATION),
and the status says what to change; once Kueue manages the kind, it finds the
suspended job, makes its Workload and admits it as any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.contract import (
    HOSTNAME_LABEL,
    KUEUE_HOLD_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    NOT_MANAGED_BY_KUEUE,
    WORKLOAD_API_VERSION,
    WORKLOAD_KIND,
)

from .. import backends
from .bodies import NODE_LEVELS as NODE_LEVELS
from .bodies import ObjectMeta, TopologyAssignment, WorkloadView, by_type
from .bodies.workloads import trimmed
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
    for ref in ObjectMeta.of(workload).owner_references:
        if ref.kind in backends.BY_KIND and ref.controller:
            return ref.body
    return None


def trim_workload(workload: Mapping[str, Any]) -> Json:
    """The parts of a Workload the status and the suspend intent need."""
    return trimmed(workload)


@dataclass(frozen=True)
class Placement:
    """The topology domains Kueue assigned the pods, at the level the training asked for."""

    level: str
    domains: tuple[str, ...]


def _nodes_only(wanted: str, topo: TopologyAssignment) -> list[str]:
    """The assigned nodes, when the assignment names nodes but not the requested level; else [].

    With kubernetes.io/hostname as the Topology's lowest level, Kueue v0.17.0
    keeps only that level in the assignment: the domain at the requested level
    is then a label of those nodes.
    """
    if wanted in topo.levels or HOSTNAME_LABEL not in topo.levels:
        return []
    return list(dict.fromkeys(topo.values(HOSTNAME_LABEL)))


def nodes_to_resolve(workload: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """The requested level and the assigned nodes whose labels name its domain (_nodes_only)."""
    for wanted, topo in WorkloadView.of(workload).topology_requests():
        if nodes := _nodes_only(wanted, topo):
            return wanted, nodes
    return None


def placement(workload: Mapping[str, Any] | None) -> Placement | None:
    """Where an admitted Workload's pods go, by topology domain (Kueue v0.17.0's TopologyAssignment).

    The level shown is the one the PodSet requested (required, else preferred),
    read from the assignment or, where that names nodes only, from the nodes'
    labels (NODE_LEVELS); otherwise the assignment's top level.
    """
    if workload is None:
        return None
    view = WorkloadView.of(workload)
    for wanted, topo in view.topology_requests():
        if wanted in topo.levels:
            return Placement(wanted, tuple(dict.fromkeys(topo.values(wanted))))
        known = view.node_levels
        nodes = _nodes_only(wanted, topo)
        if nodes and all(known.get(n) for n in nodes):
            return Placement(wanted, tuple(dict.fromkeys(known[n] for n in nodes)))
        if topo.levels:
            return Placement(topo.levels[0], tuple(dict.fromkeys(topo.values(topo.levels[0]))))
    return None


def is_active(workload: Mapping[str, Any]) -> bool:
    """spec.active (Kueue defaults it to true)."""
    return WorkloadView.of(workload).active


@dataclass(frozen=True)
class QueueState:
    """What the Workload says: admitted or not, why, and the last eviction."""

    admitted: bool
    reason: str
    message: str
    evicted: Mapping[str, Any] | None = None  # the Workload's Evicted condition, when it has one
    placement: Placement | None = None  # topology domains, while admitted with a topology request


def is_suspended(job: Mapping[str, Any]) -> bool:
    spec, _ = backends.BY_KIND[job["kind"]].kubeflow_v1_view(job)
    return bool(spec["runPolicy"].get("suspend", False))


def let_through(job: Mapping[str, Any]) -> bool:
    """A queued job that Kueue's webhook did not suspend at its creation: Kueue does not manage its kind."""
    return KUEUE_QUEUE_LABEL in ObjectMeta.of(job).labels and not is_suspended(job)


def held_for_kueue(job: Mapping[str, Any] | None) -> bool:
    return job is not None and KUEUE_HOLD_ANNOTATION in ObjectMeta.of(job).annotations


async def hold_for_kueue(client: KubeClient, job: Mapping[str, Any]) -> Json:
    """Suspend a job that Kueue let through, and mark it so that the status can say why."""
    backend = backends.BY_KIND[job["kind"]]
    meta = job["metadata"]
    patch = {
        **backend.suspend_patch(True),
        "metadata": {"annotations": {KUEUE_HOLD_ANNOTATION: f"Kueue does not manage {backend.ref.plural}"}},
    }
    return await client.merge_patch(backend.ref.api_version, backend.ref.kind, meta["namespace"], meta["name"], patch)


def not_managed_message(job: Mapping[str, Any], queue: str) -> str:
    backend = backends.BY_KIND[job["kind"]]
    kind, name = job["kind"], job["metadata"]["name"]
    others = [b.ref.name for b in backends.REGISTRY.values() if b is not backend]
    alternative = "".join(f", or use spec.backend: {other}" for other in others)
    return (
        f"Kueue did not suspend {kind} {name} when it was created, so it does not manage {kind}s here: "
        f"the operator holds it suspended so that it does not run outside LocalQueue {queue}. "
        f"Add {backend.kueue_integration} to integrations.frameworks in Kueue's configuration (Kueue 0.19 "
        f"and later leave kubeflow.org/pytorchjob out by default) and restart Kueue, which then queues "
        f"this job{alternative}"
    )


def queue_state(workload: Mapping[str, Any] | None, queue: str, job: Mapping[str, Any] | None = None) -> QueueState:
    """The training's queue state from its Workload (None: Kueue has not made one yet) and its job."""
    if workload is None and held_for_kueue(job):
        assert job is not None
        return QueueState(False, NOT_MANAGED_BY_KUEUE, not_managed_message(job, queue))
    if workload is None:
        return QueueState(
            False,
            "NoWorkload",
            f"waiting for Kueue to create the job's Workload in LocalQueue {queue} "
            f"(Kueue must run with the integration of the job's kind: {KUEUE_INTEGRATIONS})",
        )
    conds = by_type(WorkloadView.of(workload).conditions)
    evicted_cond = conds.get(EVICTED)
    evicted = evicted_cond.body if evicted_cond is not None else None
    admitted = conds.get(ADMITTED)
    if admitted is not None and admitted.status == "True":
        reason, message = admitted.reason or ADMITTED, admitted.message
        return QueueState(True, reason, message, evicted, placement(workload))
    if evicted_cond is not None and evicted_cond.status == "True":
        reason = evicted_cond.reason or EVICTED
        return QueueState(False, reason, f"{reason}: {evicted_cond.message}".rstrip(": "), evicted)
    # Why it waits: QuotaReserved=False says which quota is short, or why the queue cannot admit it.
    pending = conds.get(QUOTA_RESERVED)
    if pending is not None and pending.status == "False":
        return QueueState(False, pending.reason or "Pending", pending.message, evicted)
    if pending is not None:
        return QueueState(False, "QuotaReserved", pending.message, evicted)
    return QueueState(False, "Pending", f"queued in LocalQueue {queue}; Kueue has not evaluated it yet", evicted)


async def set_active(client: KubeClient, workload: Mapping[str, Any], active: bool) -> Json:
    """Kueue's stop and resume: spec.active false evicts the workload (Deactivated), true requeues it."""
    meta = ObjectMeta.of(workload)
    return await client.merge_patch(
        WORKLOAD_API_VERSION, WORKLOAD_KIND, meta.namespace, meta.name, {"spec": {"active": active}}
    )
