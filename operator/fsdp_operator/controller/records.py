"""What the pod loop writes into the status: the pods' placement and start, the stall verdict, the progress."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fsdp_api import API_VERSION, KIND

from . import bodies
from .nodes.health import NodeHealth
from .stall import StallVerdict
from .state import Runtime
from .status.compute import (
    CONFIG_VALID,
    NODES_HEALTHY,
    PODS_STARTED,
    SCHEDULABLE,
    STALLED,
    EventSpec,
    Observations,
    PodsReport,
    declared_subset,
    merge_patch,
)
from .sync import sync_locked

Json = dict[str, Any]


async def _record(
    rt: Runtime,
    training: Mapping[str, Any],
    watched: Callable[[Mapping[str, Any]], Any],
    source: str,
    seen: Observations,
    events: list[EventSpec] | None = None,
) -> bool:
    """Recompute the status with one more input from the pod loop; True if what ``watched`` reads changed.

    Recomputes the whole status from the last job seen, so the conditions
    and status.message stay consistent with the phase. Skipped while an
    apply is in flight or before the job watch has delivered the job (either
    will write the status soon, and the next tick retries).
    """
    uid = bodies.uid_of(training)
    async with rt.lock(uid):
        job = rt.jobs.get(uid)
        if job is None or uid in rt.applying:
            return False
        before = watched(rt.previous_status(training))
        await sync_locked(rt, training, job, seen, source=source, events=events, in_handler=False)
        return before != watched(rt.previous_status(training))


def _conditions(types: tuple[str, ...], *fields: str) -> Callable[[Mapping[str, Any]], list[Any]]:
    """The conditions of ``types`` in a status: whole, or only ``fields`` of each."""

    def read(status: Mapping[str, Any]) -> list[Any]:
        found = [c for c in status.get("conditions") or [] if c.get("type") in types]
        return [tuple(c.get(f) for f in fields) for c in found] if fields else found

    return read


async def record_pods(rt: Runtime, training: Mapping[str, Any], report: PodsReport) -> bool:
    """Write what the pods say (placement, start, a rejected config); True if one of those conditions changed."""
    watched = _conditions((SCHEDULABLE, PODS_STARTED, CONFIG_VALID))
    return await _record(rt, training, watched, "pods", Observations.of_pods(report))


async def record_nodes(
    rt: Runtime,
    training: Mapping[str, Any],
    health: NodeHealth,
    *,
    excluded: list[dict[str, Any]] | None = None,
    incidents: list[dict[str, Any]] | None = None,
    events: list[EventSpec] | None = None,
) -> bool:
    """Write what the nodes under the pods say (the nodes excluded, the incidents); True if NodesHealthy changed."""
    watched = _conditions((NODES_HEALTHY,), "status", "message")
    seen = Observations(nodes=health, excluded_nodes=excluded, node_incidents=incidents)
    return await _record(rt, training, watched, "nodes", seen, events)


async def record_stall(
    rt: Runtime,
    training: Mapping[str, Any],
    stall: StallVerdict,
    *,
    restarts: int | None = None,
    events: list[EventSpec] | None = None,
    incidents: list[dict[str, Any]] | None = None,
) -> bool:
    """Write the stall check's verdict (a new restart count, the node it blames); True if Stalled changed."""
    watched = _conditions((STALLED,), "status", "reason")
    seen = Observations(stall=stall, stall_restarts=restarts, node_incidents=incidents)
    return await _record(rt, training, watched, "stall", seen, events)


async def record_progress(
    rt: Runtime, training: Mapping[str, Any], fields: Mapping[str, Any], *, final: bool = False
) -> bool:
    """Write scraped step/loss/throughput into the status if any of them changed.

    A periodic scrape writes only while the training is Running: one started
    just before the job finished must not overwrite the final figures. The
    ``final`` read, made once the job has finished, writes what the trainer
    last reported; for a Succeeded job, whose step is maxSteps by construction,
    only figures from that very step are taken.
    """
    meta = training.get("metadata") or {}
    uid = meta.get("uid", "")
    async with rt.lock(uid):
        previous = rt.previous_status(training)
        phase = previous.get("phase")
        if not final and phase != "Running":
            return False
        if final and phase == "Succeeded":
            if fields.get("step") != previous.get("step"):
                return False
            fields = {k: v for k, v in fields.items() if k in ("loss", "tokensPerSecond", "trackerRuns", "router")}
        relevant = {k: previous[k] for k in fields if k in previous}
        if "checkpoint" in fields and "checkpoint" in previous:
            relevant["checkpoint"] = {
                key: (previous["checkpoint"] or {}).get(key) for key in ("lastStep", "lastUploadedStep")
            }
        patch = merge_patch(relevant, dict(fields))
        # merge_patch deletes keys absent from `fields`; progress only ever adds or updates.
        patch = {k: v for k, v in patch.items() if v is not None}
        if not patch:
            return False
        response = await rt.client.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], patch)
        rt.wrote_status(uid, response, declared_subset(response.get("status")))
        rt.metrics.status_updates.labels("progress").inc()
        return True
