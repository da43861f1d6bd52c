"""Apply a training: render, refuse to take over foreign objects, server-side apply, prune, record the outcome.

Apply is server-side apply of objects with deterministic names, so running
it twice (a retry, a restart mid-reconcile, a resume) converges on the same
objects and never duplicates them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from fsdp_api import API_VERSION, KIND, FSDPTraining, format_errors
from fsdp_api.contract import NETWORKPOLICY_KIND, NOT_MANAGED_BY_KUEUE, PODMONITOR_KIND
from fsdp_api.memory_plan import MemoryPlan, plan_memory
from pydantic import ValidationError

from .. import backends
from ..render import render
from . import bodies
from .kube import NETWORK_ERRORS, ApiError
from .queueing import hold_for_kueue, is_active, let_through, not_managed_message, set_active
from .state import Runtime, newest_job, owner_of, trim
from .status.compute import (
    APPLY_FAILED,
    FOREIGN_OBJECT,
    GENERATION_ANNOTATION,
    INVALID_SPEC,
    EventSpec,
    Observations,
    ReconcileOutcome,
)
from .sync import sync_locked, sync_status

log = logging.getLogger(__name__)

Json = dict[str, Any]


def _seconds_since(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (datetime.now(UTC) - then).total_seconds())


def training_model(body: Mapping[str, Any]) -> FSDPTraining:
    return FSDPTraining.model_validate(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": (trim(body))["metadata"],
            "spec": dict(body.get("spec") or {}),
        }
    )


def rendered_objects(body: Mapping[str, Any], model: FSDPTraining | None = None) -> list[Json]:
    """The objects to apply, stamped with the generation they come from (for observedGeneration).

    ``model``: the body already validated (``training_model``); validated here otherwise.
    """
    objects = render(model if model is not None else training_model(body), set_owner=True)
    meta = bodies.ObjectMeta.of(body)
    generation = str(meta.generation)
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("annotations", {})[GENERATION_ANNOTATION] = generation
        obj["metadata"].setdefault("namespace", meta.namespace or None)
    return objects


MAX_RETRY_DELAY = 300.0


def retry_delay(retry: int, base: float) -> float:
    """Seconds before kopf's next try: ``base`` doubled per earlier retry, capped."""
    return min(MAX_RETRY_DELAY, base * 2 ** min(retry, 16))


async def apply_training(rt: Runtime, body: Mapping[str, Any], *, prune: bool = True, retry: int = 0) -> None:
    """Render and server-side apply the training's objects, then update its status.

    Raises kopf.TemporaryError for API failures (kopf retries with backoff);
    an invalid spec is recorded in the status and not retried (a spec
    update triggers a new attempt). ``prune`` (not needed on create) removes
    the PodMonitor once spec.metrics.enabled is off.
    """
    started = time.perf_counter()
    # The spec is validated once per apply: the model renders the objects, plans the memory
    # for the status, and names the optional objects a prune looks for.
    try:
        model = training_model(body)
        objects = rendered_objects(body, model)
    except ValidationError as e:
        message = "; ".join(format_errors(e, model=FSDPTraining))
        rt.metrics.reconciles.labels("invalid").inc()
        await record_failure(rt, body, ReconcileOutcome(False, INVALID_SPEC, message))
        return

    events: list[EventSpec] = []
    uid = bodies.uid_of(body)
    # While this apply runs, job events only record the job (see handle_job_event):
    # this path writes the status once, from the freshest job it knows.
    rt.applying.add(uid)
    try:
        await _apply_objects(rt, body, model, objects, events, prune=prune, retry=retry)
    finally:
        rt.applying.discard(uid)
        # Also when the apply failed: stopping a queued training must not wait for its job to apply.
        await keep_suspend_intent(rt, body)
    rt.metrics.reconciles.labels("success").inc()
    rt.metrics.reconcile_duration.observe(time.perf_counter() - started)


def _queue(body: Mapping[str, Any]) -> str:
    return str(((body.get("spec") or {}).get("scheduling") or {}).get("queue") or "")


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.uid == uid and ref.controller for ref in bodies.ObjectMeta.of(obj).owner_references)


async def _existing_objects(rt: Runtime, objects: list[Json], uid: str) -> tuple[list[str], Json | None]:
    """The rendered objects whose name is taken by an object this training does not own, and its job.

    Server-side apply with force would silently adopt such an object (and the
    garbage collector would later delete it with the training), so every
    name is checked before anything is applied.
    """
    foreign = []
    job = None
    for obj in objects:
        meta = obj["metadata"]
        found = await rt.client.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if found is not None and not _owned_by(found, uid):
            owners = [f"{r.kind}/{r.name}" for r in bodies.ObjectMeta.of(found).owner_references]
            foreign.append(
                f"{obj['kind']} {meta['name']} ({'owned by ' + ', '.join(owners) if owners else 'no owner'})"
            )
        elif found is not None and obj["kind"] in backends.BY_KIND:
            job = found
    return foreign, job


def _keep_immutable(obj: Json, existing: Json, generation: str) -> tuple[Json, str]:
    """The job to apply over ``existing`` (what its API refuses to change kept as it is) and the
    Reconciled message when that holds back this generation's changes ("" when not)."""
    job, kept = backends.BY_KIND[obj["kind"]].keep_immutable(obj, existing)
    if not kept:
        return job, ""
    meta = existing["metadata"]
    where = f"{existing['kind']} {meta.get('namespace')}/{meta['name']}"
    log.info("%s keeps %s as it is on the server", where, " and ".join(kept))
    applied = bodies.ObjectMeta.of(existing).annotations.get(GENERATION_ANNOTATION)
    if applied == generation:
        # Only the rendering differs (a newer operator, or Kueue's rewrite on admission):
        # nothing the user asked for is held back.
        return job, ""
    if applied is not None:
        # Held back: the status keeps the generation the job really runs.
        job["metadata"].setdefault("annotations", {})[GENERATION_ANNOTATION] = applied
    return job, (
        f"generation {generation} is not all applied to {where}: it keeps {' and '.join(kept)} as they are while it "
        "runs (its API refuses changes there); suspend it (spec.suspend: true, then false) to apply them"
    )


async def _apply_objects(
    rt: Runtime,
    body: Mapping[str, Any],
    model: FSDPTraining,
    objects: list[Json],
    events: list[EventSpec],
    *,
    prune: bool,
    retry: int,
) -> None:
    memory = plan_memory(model.spec)
    meta = bodies.ObjectMeta.of(body)
    uid = meta.uid
    job: Json | None = None
    outcome = ReconcileOutcome(True, "Applied")
    try:
        foreign, existing = await _existing_objects(rt, objects, uid)
        if foreign:
            rt.metrics.reconciles.labels("error").inc()
            delay = retry_delay(retry, 5)
            message = (
                f"refusing to take over {'; '.join(foreign)}: delete or rename it, or rename this FSDPTraining; "
                f"checking again in {delay:g} s"
            )
            await record_failure(rt, body, ReconcileOutcome(False, FOREIGN_OBJECT, message), memory=memory)
            raise kopf.TemporaryError(message, delay=delay)
        for obj in objects:
            is_job = obj["kind"] in backends.BY_KIND
            if is_job and existing is not None:
                obj, held_back = _keep_immutable(obj, existing, str(meta.generation))
                outcome = ReconcileOutcome(True, "Applied", held_back)
            result = await rt.client.apply(obj)
            if is_job:
                job = result.body
                if result.created:
                    latency = _seconds_since(meta.creation_timestamp)
                    if latency is not None:
                        rt.metrics.create_to_job.observe(latency)
                    events.append(
                        EventSpec("Normal", "JobCreated", f"created {obj['kind']} {result.body['metadata']['name']}")
                    )
                    if let_through(job):
                        job = await hold_for_kueue(rt.client, job)
                        why = not_managed_message(job, _queue(body))
                        events.append(EventSpec("Warning", NOT_MANAGED_BY_KUEUE, why))
        if prune:
            rendered = {o["kind"] for o in objects}
            for kind in OPTIONAL_KINDS:
                if kind not in rendered:
                    await _delete_stale(rt, body, kind, model)
    except ApiError as e:
        rt.metrics.reconciles.labels("error").inc()
        await record_failure(rt, body, ReconcileOutcome(False, APPLY_FAILED, e.message), job=job, memory=memory)
        delay = retry_delay(retry, 5 if e.retryable else 30)
        raise kopf.TemporaryError(f"applying the rendered objects failed: {e}", delay=delay) from e
    except NETWORK_ERRORS as e:
        rt.metrics.reconciles.labels("error").inc()
        raise kopf.TemporaryError(f"API server unreachable: {e!r}", delay=retry_delay(retry, 2)) from e

    try:
        async with rt.lock(uid):
            rt.applying.discard(uid)  # under the lock: a job event now waits for this sync, then runs its own
            job = newest_job(job, rt.jobs.get(uid))
            seen = Observations(outcome=outcome, memory=memory)
            await sync_locked(rt, body, job, seen, source="apply", events=events)
    except (ApiError, *NETWORK_ERRORS) as e:
        # The objects are applied; only the status lags. Retrying re-applies (a no-op) and writes it.
        rt.metrics.reconciles.labels("error").inc()
        raise kopf.TemporaryError(f"status update failed: {e!r}", delay=retry_delay(retry, 2)) from e


async def keep_suspend_intent(rt: Runtime, body: Mapping[str, Any]) -> None:
    """A queued training's spec.suspend, as its Workload's spec.active (Kueue owns the job's suspend).

    Called after each apply and each Workload event: the Workload appears
    after the job, so the first call may find none and a later one sets it.
    """
    if not _queue(body):
        return
    spec = body.get("spec") or {}
    uid = bodies.uid_of(body)
    workload = rt.workloads.get(uid)
    want = not bool(spec.get("suspend", False))
    if workload is None or is_active(workload) == want:
        return
    try:
        patched = await set_active(rt.client, workload, want)
    except (ApiError, *NETWORK_ERRORS) as e:
        # The next Workload event (or apply) tries again.
        log.warning("could not set spec.active=%s on Workload %s: %s", want, bodies.name_of(workload), e)
        return
    rt.workloads[uid] = {**workload, "spec": {**workload.get("spec", {}), "active": want}}
    log.info("Workload %s: spec.active=%s (spec.suspend=%s)", patched["metadata"]["name"], want, not want)


async def record_failure(
    rt: Runtime,
    body: Mapping[str, Any],
    outcome: ReconcileOutcome,
    job: Json | None = None,
    memory: MemoryPlan | None = None,
) -> None:
    """Best effort: the failure goes to the status and an Event, unless the API itself is what fails."""
    meta = bodies.ObjectMeta.of(body)
    # An update that fails leaves the previous job in place: keep mirroring it.
    job = newest_job(job, rt.jobs.get(meta.uid))
    if job is None:
        try:
            ref = backends.of_training(body).ref
            job = await rt.client.get(ref.api_version, ref.kind, meta.namespace, meta.name)
        except (ApiError, *NETWORK_ERRORS):
            job = None
    try:
        await sync_status(rt, body, job, outcome=outcome, source="apply", memory=memory)
    except (ApiError, *NETWORK_ERRORS) as e:
        log.warning("could not record %s on %s/%s: %s", outcome.reason, meta.namespace, meta.name, e)


def _enable_metrics(model: FSDPTraining) -> None:
    model.spec.metrics.enabled = True


def _enable_network_policy(model: FSDPTraining) -> None:
    model.spec.network_policy.enabled = True


# Objects a spec field can turn off: a later generation without one deletes the earlier one.
OPTIONAL_KINDS = {PODMONITOR_KIND: _enable_metrics, NETWORKPOLICY_KIND: _enable_network_policy}


async def _delete_stale(rt: Runtime, body: Mapping[str, Any], kind: str, applied: FSDPTraining) -> None:
    """Delete the optional object of ``kind`` an earlier generation rendered, if it is this training's."""
    meta = bodies.ObjectMeta.of(body)
    # The renderer decides the name: ask it for the object it renders with the option on (on a copy).
    model = applied.model_copy(deep=True)
    OPTIONAL_KINDS[kind](model)
    candidate = next((o for o in render(model) if o["kind"] == kind), None)
    if candidate is None:
        return
    api_version, name = candidate["apiVersion"], candidate["metadata"]["name"]
    found = await rt.client.get(api_version, kind, meta.namespace, name)
    ref = owner_of(found) if found is not None else None
    if found is None or ref is None or ref.get("uid") != meta.uid:
        return
    await rt.client.delete(api_version, kind, meta.namespace, name, uid=found["metadata"]["uid"])
