"""The status sync: compute the status from a training and its job, patch it if it changed, post the transitions.

Serialised per training (``Runtime.lock``), so every writer starts from what
the previous one wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fsdp_api import API_VERSION, KIND
from fsdp_api.memory_plan import MemoryPlan, plan_memory
from fsdp_api.spec import FSDPTrainingSpec
from pydantic import ValidationError

from . import bodies
from .events import create_events, post_events
from .queueing import queue_state
from .state import Runtime
from .status.compute import (
    EventSpec,
    Observations,
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
    seen: Observations,
    *,
    source: str,
    events: list[EventSpec] | None = None,
    in_handler: bool = True,
) -> tuple[str | None, str]:
    """Compute the status from ``body``, ``job`` and what was ``seen``; patch it if it changed; record transitions.

    ``in_handler``: called from a kopf handler, whose Event queue posts the
    transitions in the background; otherwise they are posted here. Returns
    the phase before and after. ``seen.memory``: the plan of the spec the apply validated (an
    apply outcome without it plans from the body; a sync without an outcome keeps the previous one).
    ``seen.queue`` is read here, from the training's Workload.
    """
    meta = body.get("metadata") or {}
    uid = meta.get("uid", "")
    previous = rt.previous_status(body)
    # The plan depends on the spec only: made when it is applied, kept in between.
    if seen.memory is None and seen.outcome is not None:
        seen = replace(seen, memory=memory_plan_of(body))
    facts = TrainingFacts.from_body(body)
    if facts.queue is not None:
        seen = replace(seen, queue=queue_state(rt.workloads.get(uid), facts.queue, job))
    new = compute_status(facts, job, previous, seen)
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
        await sync_locked(rt, body, job, Observations(outcome=outcome, memory=memory), source=source, events=events)
