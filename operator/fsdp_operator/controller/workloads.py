"""Kueue's Workloads of queued trainings' jobs: keep the suspend intent, mirror the queue state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import backends
from .applies import keep_suspend_intent
from .bodies import NodeView, ObjectMeta, uid_of
from .kube import ApiError
from .queueing import NODE_LEVELS, nodes_to_resolve, owning_job, trim_workload
from .state import Runtime, owner_body, owner_of, trim_job
from .status.compute import Observations
from .sync import sync_locked

Json = dict[str, Any]


async def _training_of_workload(rt: Runtime, workload: Mapping[str, Any]) -> Json | None:
    """The training whose job owns ``workload``, with that job recorded in ``rt.jobs``; None if not ours.

    At start-up the Workload watch may deliver before the job or training
    watch: what is not known yet is read, so a queued training's status never
    waits for the Workload's next change.
    """
    ref = owning_job(workload)
    if ref is None:
        return None
    namespace = ObjectMeta.of(workload).namespace
    # Our jobs are named after their training; the job's uid tells whether it is ours.
    training = rt.trainings.get((namespace, ref.get("name", "")))
    job = rt.jobs.get(uid_of(training)) if training is not None else None
    if job is None or uid_of(job) != ref.get("uid"):
        job_ref = backends.BY_KIND[ref["kind"]].ref
        fresh = await rt.client.get(job_ref.api_version, job_ref.kind, namespace, ref.get("name", ""))
        owner = owner_of(fresh) if fresh is not None else None
        if fresh is None or owner is None or uid_of(fresh) != ref.get("uid"):
            return None
        training = await owner_body(rt, namespace, owner)
        if training is None:
            return None
        rt.jobs[uid_of(training)] = trim_job(fresh)
    return training


async def resolve_node_levels(rt: Runtime, workload: Json, previous: Mapping[str, Any] | None) -> None:
    """Where an assignment names nodes only, add each node's domain at the requested level (NODE_LEVELS).

    One node LIST per new assignment. An install that may not list nodes
    (namespaced mode) shows the nodes themselves instead.
    """
    wanted = nodes_to_resolve(workload)
    if wanted is None:
        return
    level, names = wanted
    known = dict((previous or {}).get(NODE_LEVELS) or {})
    if not all(known.get(n) for n in names):
        try:
            nodes = await rt.client.list("v1", "Node", None)
        except ApiError as e:
            if e.status in (401, 403):
                return
            raise
        views = [NodeView.of(n) for n in nodes]
        known = {v.name: v.labels.get(level) or "" for v in views if v.name in names}
    workload[NODE_LEVELS] = {n: known[n] for n in names if known.get(n)}


async def handle_workload_event(rt: Runtime, event_type: str | None, workload: Mapping[str, Any]) -> None:
    """A Kueue Workload of one of our jobs changed: keep the suspend intent, mirror it into the status."""
    training = await _training_of_workload(rt, workload)
    if training is None:
        return
    uid = uid_of(training)
    if event_type == "DELETED":
        rt.workloads.pop(uid, None)
    else:
        trimmed = trim_workload(workload)
        await resolve_node_levels(rt, trimmed, rt.workloads.get(uid))
        rt.workloads[uid] = trimmed
        await keep_suspend_intent(rt, training)
    async with rt.lock(uid):
        job = rt.jobs.get(uid)
        if job is None or uid in rt.applying:
            return  # the job is gone (its DELETED event re-creates it), or the apply in flight writes the status
        await sync_locked(rt, training, job, Observations(), source="workload")
