"""The Events a status change posts on the training, derived from the stored and the new status."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.status import Condition, FSDPTrainingStatus

from ..queueing import EVICTED
from .conditions import (
    CHECKPOINTS_PERSISTENT,
    CONFIG_VALID,
    FITS_MEMORY,
    NODES_HEALTHY,
    PODS_STARTED,
    RECONCILED,
    SCHEDULABLE,
    STALLED,
    previous_conditions,
)

Json = Mapping[str, Any]


@dataclass(frozen=True)
class EventSpec:
    """A Kubernetes Event to record on the FSDPTraining."""

    type: str  # Normal or Warning
    reason: str
    message: str


_PHASE_EVENTS: dict[str, tuple[str, str]] = {
    "Running": ("Normal", "Running"),
    "Restarting": ("Warning", "Restarting"),
    "Suspended": ("Normal", "Suspended"),
    "Queued": ("Normal", "Queued"),
    "Succeeded": ("Normal", "Succeeded"),
    "Failed": ("Warning", "Failed"),
}


def _newly_false(
    cond_type: str, new: Mapping[str, Condition], old: Mapping[str, Json], key: str | None = None
) -> Condition | None:
    """The condition if it is False now and was not before (or its ``key`` field changed)."""
    cond = new.get(cond_type)
    if cond is None or cond.status != "False":
        return None
    before = old.get(cond_type)
    if before is None or before.get("status") != "False":
        return cond
    if key is not None and before.get(key) != getattr(cond, key):
        return cond
    return None


def transition_events(previous: Json | None, status: FSDPTrainingStatus) -> list[EventSpec]:
    """Events for what changed between the stored status and the new one.

    Derived from the persisted status (not from memory), so an operator
    restart does not repeat them.
    """
    prev = previous or {}
    events: list[EventSpec] = []
    old_phase = prev.get("phase")
    if status.phase != old_phase:
        if old_phase == "Suspended" and status.phase not in ("Succeeded", "Failed"):
            events.append(EventSpec("Normal", "Resumed", f"resumed; phase {status.phase}"))
        if status.phase in _PHASE_EVENTS:
            etype, reason = _PHASE_EVENTS[status.phase]
            events.append(EventSpec(etype, reason, status.message or status.phase))
    old_conds = previous_conditions(previous)
    new_conds = {c.type: c for c in status.conditions}
    if ckpt := _newly_false(CHECKPOINTS_PERSISTENT, new_conds, old_conds):
        events.append(EventSpec("Warning", "EphemeralCheckpoints", ckpt.message))
    # One Event each time the condition turns False, and again when its reason (or message) changes.
    renotify = {
        PODS_STARTED: "reason",
        CONFIG_VALID: None,
        SCHEDULABLE: None,
        RECONCILED: "message",
        FITS_MEMORY: "message",
        NODES_HEALTHY: "message",
    }
    for cond_type, key in renotify.items():
        if cond := _newly_false(cond_type, new_conds, old_conds, key):
            events.append(EventSpec("Warning", cond.reason, cond.message))
    evicted, was = new_conds.get(EVICTED), old_conds.get(EVICTED)
    if evicted is not None and evicted.status == "True" and (was or {}).get("status") != "True":
        events.append(EventSpec("Warning", evicted.reason, evicted.message))
    stalled, was = new_conds.get(STALLED), old_conds.get(STALLED)
    if stalled is not None and stalled.status != (was or {}).get("status"):
        if stalled.status == "True":
            events.append(EventSpec("Warning", STALLED, stalled.message))
        elif (was or {}).get("status") == "True":
            events.append(EventSpec("Normal", "StallCleared", f"no longer stalled: {stalled.message}"))
    return events
