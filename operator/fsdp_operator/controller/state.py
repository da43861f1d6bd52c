"""The operator's in-memory state: the trainings, jobs and Workloads seen on the watches, and what it wrote.

Also the trimmed forms kept there (``trim``, ``trim_job``: a job in the
Kubeflow v1 terms of its backend) and whose training a job is (``owner_of``).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdp_api import API_VERSION, KIND

from .. import backends
from . import bodies
from .kube import KubeClient
from .metrics import OperatorMetrics
from .nodes.stragglers import StragglerWatch
from .stall import StepClock
from .status.compute import declared_subset

Json = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


@dataclass
class Runtime:
    """The operator's in-memory state, shared by all handlers of one process."""

    client: KubeClient
    metrics: OperatorMetrics
    # Latest FSDPTraining bodies seen on the watch (trimmed), for job events and the scraper.
    trainings: dict[Key, Json] = field(default_factory=dict)
    # uid -> (resourceVersion, status) this process last wrote: newer than the watch's copy
    # until the watch delivers that version (or a later one, which may hold others' writes).
    statuses: dict[str, tuple[int, Json]] = field(default_factory=dict)
    # training uid -> its job as last seen on the watch (trimmed: trim_job).
    jobs: dict[str, Json] = field(default_factory=dict)
    # training uid -> its job's Kueue Workload as last seen on the watch (trimmed), for queued trainings.
    workloads: dict[str, Json] = field(default_factory=dict)
    # training uid -> its stall check's clock (controller/stall/), while it runs.
    step_clocks: dict[str, StepClock] = field(default_factory=dict)
    # training uid -> its ranks' lateness at the last node check (controller/nodes/stragglers.py), while it runs.
    stragglers: dict[str, StragglerWatch] = field(default_factory=dict)
    # training uids with an apply in flight.
    applying: set[str] = field(default_factory=set)
    # Work started from handlers that must outlive them (re-creating a deleted job).
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # Created inside a kopf handler, the task inherits its context (Events go through kopf's queue).
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def remember(self, body: Mapping[str, Any]) -> None:
        meta = bodies.ObjectMeta.of(body)
        key = (meta.namespace, meta.name)
        self.trainings[key] = trim(body)
        self.metrics.phases[meta.uid] = (body.get("status") or {}).get("phase") or "Pending"
        self.metrics.watch_exclusions(*key)

    def forget(self, body: Mapping[str, Any]) -> None:
        meta = bodies.ObjectMeta.of(body)
        key = (meta.namespace, meta.name)
        uid = meta.uid
        known = self.trainings.get(key)
        if known is not None and bodies.uid_of(known) == uid:
            del self.trainings[key]
            self.metrics.forget_exclusions(*key)
        self.statuses.pop(uid, None)
        self.jobs.pop(uid, None)
        self.workloads.pop(uid, None)
        self.step_clocks.pop(uid, None)
        self.stragglers.pop(uid, None)
        self._locks.pop(uid, None)
        self.metrics.forget([uid])

    def previous_status(self, body: Mapping[str, Any]) -> Json:
        uid = bodies.uid_of(body)
        written = self.statuses.get(uid)
        if written is not None and written[0] > resource_version(body):
            return written[1]
        return declared_subset(body.get("status"))

    def wrote_status(self, uid: str, response: Mapping[str, Any], status: Json) -> None:
        self.statuses[uid] = (resource_version(response), status)


_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
)


def trim(body: Mapping[str, Any]) -> Json:
    """The parts of an FSDPTraining the operator uses (no managedFields, no kopf annotations)."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", KIND),
        "metadata": {k: copy.deepcopy(meta[k]) for k in _KEPT_METADATA if k in meta},
        "spec": copy.deepcopy(dict(body.get("spec") or {})),
        "status": copy.deepcopy(dict(body.get("status") or {})),
    }


def trim_job(job: Mapping[str, Any]) -> Json:
    """The parts of a job the status needs, in the PyTorchJob's terms (its backend's ``kubeflow_v1_view``)."""
    meta = job.get("metadata") or {}
    backend = backends.of_kind(job.get("kind"))
    spec, status = backend.kubeflow_v1_view(job)
    return {
        "kind": job.get("kind") or backend.ref.kind,
        "metadata": {
            k: copy.deepcopy(meta[k])
            for k in ("name", "namespace", "uid", "resourceVersion", "annotations", "creationTimestamp")
            if k in meta
        },
        "spec": spec,
        "status": status,
    }


def resource_version(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion", -1))
    except (TypeError, ValueError):
        return -1  # opaque (not etcd): treat as older than anything we can compare


def newest_job(applied: Json | None, watched: Json | None) -> Json | None:
    """The fresher of the apply response and the last watch event (by resourceVersion)."""
    if applied is None or watched is None:
        return applied or watched
    return watched if resource_version(watched) > resource_version(applied) else applied


# Retries of a failing apply or status write back off up to this many seconds.


def owner_of(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The FSDPTraining ownerReference of a job, if it is one of ours."""
    for ref in bodies.ObjectMeta.of(job).owner_references:
        if ref.kind == KIND and ref.api_version.split("/")[0] == API_VERSION.split("/")[0]:
            return ref.body
    return None


async def owner_body(rt: Runtime, namespace: str, ref: Mapping[str, Any]) -> Json | None:
    known = rt.trainings.get((namespace, ref["name"]))
    if known is not None and known["metadata"].get("uid") == ref.get("uid"):
        return known
    # Not seen on our watch yet (start-up ordering between two watches): ask.
    fresh = await rt.client.get(API_VERSION, KIND, namespace, ref["name"])
    if fresh is None or bodies.uid_of(fresh) != ref.get("uid"):
        return None  # an orphan waiting for garbage collection
    rt.remember(fresh)
    return rt.trainings[(namespace, ref["name"])]
