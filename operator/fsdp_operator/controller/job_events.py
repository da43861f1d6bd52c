"""A job's watch events: mirror its status into the training's; re-create a job deleted under a live training."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from fsdp_api import API_VERSION, KIND

from .. import backends
from .applies import apply_training
from .bodies import ObjectMeta
from .events import post_events
from .kube import NETWORK_ERRORS, ApiError
from .state import Runtime, owner_body, owner_of, trim_job
from .status.compute import JOB_RECREATE_FAILED, EventSpec, Observations, ReconcileOutcome
from .sync import sync_locked, sync_status

log = logging.getLogger(__name__)

Json = dict[str, Any]


TERMINAL_PHASES = ("Succeeded", "Failed")
JOB_DELETED_AFTER_END = (
    "the {kind} of this {phase} training was deleted; it is not re-created, so the training does not run again"
)


async def handle_job_event(rt: Runtime, event_type: str | None, job: Mapping[str, Any]) -> Json | None:
    """Mirror a job's change into its FSDPTraining; re-create a job deleted from under a live training.

    Returns the training when this event made it finish (Succeeded or
    Failed), so the caller can read the trainer's metrics one last time.
    """
    ref = owner_of(job)
    if ref is None:
        return None
    namespace = ObjectMeta.of(job).namespace
    training = await owner_body(rt, namespace, ref)
    if training is None:
        return None
    uid = str(ref.get("uid", ""))
    if event_type == "DELETED":
        rt.jobs.pop(uid, None)
        rt.spawn(recreate_job(rt, namespace, ref["name"], uid))
        return None
    rt.jobs[uid] = trim_job(job)
    async with rt.lock(uid):
        if uid in rt.applying:
            return None  # the apply in flight syncs the status with this job when it finishes
        before, after = await sync_locked(rt, training, rt.jobs[uid], Observations(), source="job")
    return training if after in TERMINAL_PHASES and before not in TERMINAL_PHASES else None


# Seconds between attempts to re-create a deleted job; the last one repeats.
RECREATE_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


async def _live_training(rt: Runtime, namespace: str, name: str, uid: str) -> Json | None:
    """The training, freshly read, if it still is the one with ``uid`` and is not being deleted."""
    fresh = await rt.client.get(API_VERSION, KIND, namespace, name)
    if fresh is None:
        return None
    meta = ObjectMeta.of(fresh)
    if meta.uid != uid or meta.deleting:
        return None
    return fresh


async def recreate_job(rt: Runtime, namespace: str, name: str, uid: str) -> None:
    """A job was deleted under its training: apply it again, retrying until it exists.

    A finished (Succeeded or Failed) training never gets its job back: that
    would train it again, from step 0 when checkpoints are ephemeral. A
    training being deleted (foreground GC) neither. Failures are retried with
    backoff (kopf never retries an event handler), each one in the status.
    """
    for attempt in itertools.count(1):
        try:
            fresh = await _live_training(rt, namespace, name, uid)
            if fresh is None or uid in rt.jobs:  # gone, replaced, or re-created meanwhile
                return
            phase = (fresh.get("status") or {}).get("phase")
            kind = backends.of_training(fresh).ref.kind
            if phase in TERMINAL_PHASES:
                log.info("%s %s/%s of a %s training was deleted; not re-creating it", kind, namespace, name, phase)
                message = JOB_DELETED_AFTER_END.format(kind=kind, phase=phase)
                post_events(fresh, [EventSpec("Normal", "JobDeleted", message)])
                return
            log.info("%s %s/%s was deleted under a live FSDPTraining; re-applying", kind, namespace, name)
            await apply_training(rt, fresh)
            return
        except (kopf.TemporaryError, ApiError, *NETWORK_ERRORS) as e:
            delay = RECREATE_BACKOFF[min(attempt, len(RECREATE_BACKOFF)) - 1]
            message = f"re-creating the deleted job failed (attempt {attempt}): {e}; retrying in {delay:g} s"
            log.warning("%s/%s: %s", namespace, name, message)
            with contextlib.suppress(ApiError, *NETWORK_ERRORS):
                fresh = await _live_training(rt, namespace, name, uid)
                if fresh is not None:
                    await sync_status(
                        rt, fresh, None, outcome=ReconcileOutcome(False, JOB_RECREATE_FAILED, message), source="apply"
                    )
            await asyncio.sleep(delay)
