"""The status sync: compute the status from a training and its job, patch it if it changed, post the transitions.

Serialised per training (``Runtime.lock``), so every writer starts from what
the previous one wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_api import API_VERSION, KIND
from fsdp_api.memory_plan import MemoryPlan, plan_memory
from fsdp_api.spec import FSDPTrainingSpec
from pydantic import ValidationError

from . import bodies
from .events import create_events, post_events
from .nodes.health import NodeHealth
from .queueing import queue_state
from .stall import StallVerdict
from .state import Runtime
from .status.compute import (
    EventSpec,
    PodsReport,
    ReconcileOutcome,
    TrainingFacts,
    compute_status,
    status_document,
    status_patch,
    transition_events,
)

Json = dict[str, Any]


def memory_plan_of(body: Mapping[str, Any]) -> MemoryPlan | None:
    """The spec's memory plan; None for a spec that does not validate (Reconciled says why)."""
    try:
        return plan_memory(FSDPTrainingSpec.model_validate(dict(body.get("spec") or {})))
    except ValidationError:
        return None


async def sync_locked(
    rt: Runtime,
    body: Mapping[str, Any],
    job: Mapping[str, Any] | None,
    *,
    outcome: ReconcileOutcome | None,
    source: str,
    events: list[EventSpec] | None = None,
    pods: PodsReport | None = None,
    stall: StallVerdict | None = None,
    stall_restarts: int | None = None,
    nodes: NodeHealth | None = None,
    excluded_nodes: list[dict[str, Any]] | None = None,
    node_incidents: list[dict[str, Any]] | None = None,
    in_handler: bool = True,
    memory: MemoryPlan | None = None,
) -> tuple[str | None, str]:
    """Compute the status from ``body`` and ``job``; patch it if it changed; record transitions.

    ``in_handler``: called from a kopf handler, whose Event queue posts the
    transitions in the background; otherwise they are posted here. Returns
    the phase before and after. ``memory``: the plan of the spec the apply validated (an
    apply outcome without it plans from the body; a sync without an outcome keeps the previous one).
    """
    meta = body.get("metadata") or {}
    uid = meta.get("uid", "")
    previous = rt.previous_status(body)
    # The plan depends on the spec only: made when it is applied, kept in between.
    if memory is None:
        memory = memory_plan_of(body) if outcome is not None else None
    facts = TrainingFacts.from_body(body)
    queue = queue_state(rt.workloads.get(uid), facts.queue, job) if facts.queue is not None else None
    new = compute_status(
        facts,
        job,
        previous,
        outcome=outcome,
        scheduling=pods.scheduling if pods else None,
        rejection=pods.rejection if pods else None,
        start=pods.start if pods else None,
        stall=stall,
        stall_restarts=stall_restarts,
        memory=memory,
        queue=queue,
        nodes=nodes,
        excluded_nodes=excluded_nodes,
        node_incidents=node_incidents,
    )
    patch = status_patch(previous, new)
    to_post = list(events or []) + transition_events(previous, new)
    if patch:
        response = await rt.client.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], patch)
        rt.wrote_status(uid, response, status_document(new))
        rt.metrics.status_updates.labels(source).inc()
    rt.metrics.phases[uid] = new.phase
    if in_handler:
        post_events(body, to_post)
    else:
        await create_events(rt.client, body, to_post)
    return previous.get("phase"), new.phase


async def sync_status(
    rt: Runtime,
    body: Mapping[str, Any],
    job: Mapping[str, Any] | None,
    *,
    outcome: ReconcileOutcome | None,
    source: str,
    events: list[EventSpec] | None = None,
    memory: MemoryPlan | None = None,
) -> None:
    """The status sync, serialised per training: every writer starts from what the previous one wrote."""
    async with rt.lock(bodies.uid_of(body)):
        await sync_locked(rt, body, job, outcome=outcome, source=source, events=events, memory=memory)
