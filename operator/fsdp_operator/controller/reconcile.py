"""What the handlers do: apply the rendered objects, mirror the job (PyTorchJob or TrainJob) into the status.

Apply is server-side apply of objects with deterministic names, so running
it twice (a retry, a restart mid-reconcile, a resume) converges on the same
objects and never duplicates them. The status is a pure function of the
training, its job and the previous status (``status.py``); this module only
serialises its computation per training and writes it when it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from fsdp_api import API_VERSION, KIND, FSDPTraining, format_errors
from fsdp_api.contract import NETWORKPOLICY_KIND, PODMONITOR_KIND
from fsdp_api.memory_plan import MemoryPlan, plan_memory
from fsdp_api.spec import FSDPTrainingSpec
from pydantic import ValidationError

from .. import backends
from ..render import render
from .events import create_events, post_events
from .kube import NETWORK_ERRORS, ApiError, KubeClient
from .metrics import OperatorMetrics
from .queueing import is_active, owning_job, queue_state, set_active, trim_workload
from .stall import StallVerdict, StepClock
from .status import (
    APPLY_FAILED,
    CONFIG_VALID,
    FOREIGN_OBJECT,
    GENERATION_ANNOTATION,
    INVALID_SPEC,
    JOB_RECREATE_FAILED,
    PODS_STARTED,
    SCHEDULABLE,
    STALLED,
    EventSpec,
    PodsReport,
    ReconcileOutcome,
    TrainingFacts,
    compute_status,
    declared_subset,
    merge_patch,
    status_document,
    status_patch,
    transition_events,
)

log = logging.getLogger(__name__)

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
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        self.trainings[key] = trim(body)
        self.metrics.phases[meta.get("uid", "")] = (body.get("status") or {}).get("phase") or "Pending"

    def forget(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        uid = meta.get("uid", "")
        known = self.trainings.get(key)
        if known is not None and known["metadata"].get("uid") == uid:
            del self.trainings[key]
        self.statuses.pop(uid, None)
        self.jobs.pop(uid, None)
        self.workloads.pop(uid, None)
        self.step_clocks.pop(uid, None)
        self._locks.pop(uid, None)
        self.metrics.forget([uid])

    def previous_status(self, body: Mapping[str, Any]) -> Json:
        uid = (body.get("metadata") or {}).get("uid", "")
        written = self.statuses.get(uid)
        if written is not None and written[0] > _resource_version(body):
            return written[1]
        return declared_subset(body.get("status"))

    def wrote_status(self, uid: str, response: Mapping[str, Any], status: Json) -> None:
        self.statuses[uid] = (_resource_version(response), status)


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
        "kind": backend.ref.kind,
        "metadata": {
            k: copy.deepcopy(meta[k])
            for k in ("name", "namespace", "uid", "resourceVersion", "annotations", "creationTimestamp")
            if k in meta
        },
        "spec": spec,
        "status": status,
    }


def _seconds_since(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (datetime.now(UTC) - then).total_seconds())


def _training_model(body: Mapping[str, Any]) -> FSDPTraining:
    return FSDPTraining.model_validate(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": (trim(body))["metadata"],
            "spec": dict(body.get("spec") or {}),
        }
    )


def memory_plan_of(body: Mapping[str, Any]) -> MemoryPlan | None:
    """The spec's memory plan; None for a spec that does not validate (Reconciled says why)."""
    try:
        return plan_memory(FSDPTrainingSpec.model_validate(dict(body.get("spec") or {})))
    except ValidationError:
        return None


def rendered_objects(body: Mapping[str, Any]) -> list[Json]:
    """The objects to apply, stamped with the generation they come from (for observedGeneration)."""
    objects = render(_training_model(body), set_owner=True)
    generation = str((body.get("metadata") or {}).get("generation") or 0)
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("annotations", {})[GENERATION_ANNOTATION] = generation
        obj["metadata"].setdefault("namespace", (body.get("metadata") or {}).get("namespace"))
    return objects


async def _sync_locked(
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
    in_handler: bool = True,
) -> tuple[str | None, str]:
    """Compute the status from ``body`` and ``job``; patch it if it changed; record transitions.

    ``in_handler``: called from a kopf handler, whose Event queue posts the
    transitions in the background; otherwise they are posted here. Returns
    the phase before and after.
    """
    meta = body.get("metadata") or {}
    uid = meta.get("uid", "")
    previous = rt.previous_status(body)
    # The plan depends on the spec only: made when it is applied, kept in between.
    plan = memory_plan_of(body) if outcome is not None else None
    facts = TrainingFacts.from_body(body)
    queue = queue_state(rt.workloads.get(uid), facts.queue) if facts.queue is not None else None
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
        memory=plan,
        queue=queue,
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
) -> None:
    """The status sync, serialised per training: every writer starts from what the previous one wrote."""
    async with rt.lock((body.get("metadata") or {}).get("uid", "")):
        await _sync_locked(rt, body, job, outcome=outcome, source=source, events=events)


def _resource_version(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion", -1))
    except (TypeError, ValueError):
        return -1  # opaque (not etcd): treat as older than anything we can compare


def newest_job(applied: Json | None, watched: Json | None) -> Json | None:
    """The fresher of the apply response and the last watch event (by resourceVersion)."""
    if applied is None or watched is None:
        return applied or watched
    return watched if _resource_version(watched) > _resource_version(applied) else applied


# Retries of a failing apply or status write back off up to this many seconds.
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
    meta = body.get("metadata") or {}
    try:
        objects = rendered_objects(body)
    except ValidationError as e:
        message = "; ".join(format_errors(e))
        rt.metrics.reconciles.labels("invalid").inc()
        await _record_failure(rt, body, ReconcileOutcome(False, INVALID_SPEC, message))
        return

    events: list[EventSpec] = []
    uid = meta.get("uid", "")
    # While this apply runs, job events only record the job (see handle_job_event):
    # this path writes the status once, from the freshest job it knows.
    rt.applying.add(uid)
    try:
        await _apply_objects(rt, body, objects, events, prune=prune, retry=retry)
    finally:
        rt.applying.discard(uid)
    await keep_suspend_intent(rt, body)
    rt.metrics.reconciles.labels("success").inc()
    rt.metrics.reconcile_duration.observe(time.perf_counter() - started)


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(
        ref.get("uid") == uid and ref.get("controller")
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


async def _foreign_objects(rt: Runtime, objects: list[Json], uid: str) -> list[str]:
    """The rendered objects whose name is taken by an object this training does not own.

    Server-side apply with force would silently adopt such an object (and the
    garbage collector would later delete it with the training), so every
    name is checked before anything is applied.
    """
    foreign = []
    for obj in objects:
        meta = obj["metadata"]
        found = await rt.client.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if found is not None and not _owned_by(found, uid):
            owners = [f"{r.get('kind')}/{r.get('name')}" for r in found["metadata"].get("ownerReferences") or []]
            foreign.append(
                f"{obj['kind']} {meta['name']} ({'owned by ' + ', '.join(owners) if owners else 'no owner'})"
            )
    return foreign


async def _apply_objects(
    rt: Runtime, body: Mapping[str, Any], objects: list[Json], events: list[EventSpec], *, prune: bool, retry: int
) -> None:
    meta = body.get("metadata") or {}
    uid = meta.get("uid", "")
    job: Json | None = None
    try:
        foreign = await _foreign_objects(rt, objects, uid)
        if foreign:
            rt.metrics.reconciles.labels("error").inc()
            delay = retry_delay(retry, 5)
            message = (
                f"refusing to take over {'; '.join(foreign)}: delete or rename it, or rename this FSDPTraining; "
                f"checking again in {delay:g} s"
            )
            await _record_failure(rt, body, ReconcileOutcome(False, FOREIGN_OBJECT, message))
            raise kopf.TemporaryError(message, delay=delay)
        for obj in objects:
            result = await rt.client.apply(obj)
            if obj["kind"] in backends.BY_KIND:
                job = result.body
                if result.created:
                    latency = _seconds_since(meta.get("creationTimestamp"))
                    if latency is not None:
                        rt.metrics.create_to_job.observe(latency)
                    events.append(
                        EventSpec("Normal", "JobCreated", f"created {obj['kind']} {result.body['metadata']['name']}")
                    )
        if prune:
            rendered = {o["kind"] for o in objects}
            for kind in OPTIONAL_KINDS:
                if kind not in rendered:
                    await _delete_stale(rt, body, kind)
    except ApiError as e:
        rt.metrics.reconciles.labels("error").inc()
        await _record_failure(rt, body, ReconcileOutcome(False, APPLY_FAILED, e.message), job=job)
        delay = retry_delay(retry, 5 if e.retryable else 30)
        raise kopf.TemporaryError(f"applying the rendered objects failed: {e}", delay=delay) from e
    except NETWORK_ERRORS as e:
        rt.metrics.reconciles.labels("error").inc()
        raise kopf.TemporaryError(f"API server unreachable: {e!r}", delay=retry_delay(retry, 2)) from e

    try:
        async with rt.lock(uid):
            rt.applying.discard(uid)  # under the lock: a job event now waits for this sync, then runs its own
            job = newest_job(job, rt.jobs.get(uid))
            await _sync_locked(rt, body, job, outcome=ReconcileOutcome(True, "Applied"), source="apply", events=events)
    except (ApiError, *NETWORK_ERRORS) as e:
        # The objects are applied; only the status lags. Retrying re-applies (a no-op) and writes it.
        rt.metrics.reconciles.labels("error").inc()
        raise kopf.TemporaryError(f"status update failed: {e!r}", delay=retry_delay(retry, 2)) from e


async def keep_suspend_intent(rt: Runtime, body: Mapping[str, Any]) -> None:
    """A queued training's spec.suspend, as its Workload's spec.active (Kueue owns the job's suspend).

    Called after each apply and each Workload event: the Workload appears
    after the job, so the first call may find none and a later one sets it.
    """
    spec = body.get("spec") or {}
    if not (spec.get("scheduling") or {}).get("queue"):
        return
    uid = (body.get("metadata") or {}).get("uid", "")
    workload = rt.workloads.get(uid)
    want = not bool(spec.get("suspend", False))
    if workload is None or is_active(workload) == want:
        return
    try:
        patched = await set_active(rt.client, workload, want)
    except (ApiError, *NETWORK_ERRORS) as e:
        # The next Workload event (or apply) tries again.
        log.warning("could not set spec.active=%s on Workload %s: %s", want, workload["metadata"].get("name"), e)
        return
    rt.workloads[uid] = {**workload, "spec": {**workload.get("spec", {}), "active": want}}
    log.info("Workload %s: spec.active=%s (spec.suspend=%s)", patched["metadata"]["name"], want, not want)


async def _record_failure(
    rt: Runtime, body: Mapping[str, Any], outcome: ReconcileOutcome, job: Json | None = None
) -> None:
    """Best effort: the failure goes to the status and an Event, unless the API itself is what fails."""
    meta = body.get("metadata") or {}
    # An update that fails leaves the previous job in place: keep mirroring it.
    job = newest_job(job, rt.jobs.get(meta.get("uid", "")))
    if job is None:
        try:
            ref = backends.of_training(body).ref
            job = await rt.client.get(ref.api_version, ref.kind, meta.get("namespace"), meta["name"])
        except (ApiError, *NETWORK_ERRORS):
            job = None
    try:
        await sync_status(rt, body, job, outcome=outcome, source="apply")
    except (ApiError, *NETWORK_ERRORS) as e:
        log.warning("could not record %s on %s/%s: %s", outcome.reason, meta.get("namespace"), meta.get("name"), e)


def _enable_metrics(model: FSDPTraining) -> None:
    model.spec.metrics.enabled = True


def _enable_network_policy(model: FSDPTraining) -> None:
    model.spec.network_policy.enabled = True


# Objects a spec field can turn off: a later generation without one deletes the earlier one.
OPTIONAL_KINDS = {PODMONITOR_KIND: _enable_metrics, NETWORKPOLICY_KIND: _enable_network_policy}


async def _delete_stale(rt: Runtime, body: Mapping[str, Any], kind: str) -> None:
    """Delete the optional object of ``kind`` an earlier generation rendered, if it is this training's."""
    meta = body.get("metadata") or {}
    # The renderer decides the name: ask it for the object it renders with the option on.
    model = _training_model(body)
    OPTIONAL_KINDS[kind](model)
    candidate = next((o for o in render(model) if o["kind"] == kind), None)
    if candidate is None:
        return
    api_version, name = candidate["apiVersion"], candidate["metadata"]["name"]
    found = await rt.client.get(api_version, kind, meta.get("namespace"), name)
    ref = owner_of(found) if found is not None else None
    if found is None or ref is None or ref.get("uid") != meta.get("uid"):
        return
    await rt.client.delete(api_version, kind, meta.get("namespace"), name, uid=found["metadata"]["uid"])


def owner_of(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The FSDPTraining ownerReference of a job, if it is one of ours."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).split("/")[0] == API_VERSION.split("/")[0]:
            return ref
    return None


async def _owner_body(rt: Runtime, namespace: str, ref: Mapping[str, Any]) -> Json | None:
    known = rt.trainings.get((namespace, ref["name"]))
    if known is not None and known["metadata"].get("uid") == ref.get("uid"):
        return known
    # Not seen on our watch yet (start-up ordering between two watches): ask.
    fresh = await rt.client.get(API_VERSION, KIND, namespace, ref["name"])
    if fresh is None or (fresh.get("metadata") or {}).get("uid") != ref.get("uid"):
        return None  # an orphan waiting for garbage collection
    rt.remember(fresh)
    return rt.trainings[(namespace, ref["name"])]


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
    namespace = (job.get("metadata") or {}).get("namespace", "")
    training = await _owner_body(rt, namespace, ref)
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
        before, after = await _sync_locked(rt, training, rt.jobs[uid], outcome=None, source="job")
    return training if after in TERMINAL_PHASES and before not in TERMINAL_PHASES else None


# Seconds between attempts to re-create a deleted job; the last one repeats.
RECREATE_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


async def _live_training(rt: Runtime, namespace: str, name: str, uid: str) -> Json | None:
    """The training, freshly read, if it still is the one with ``uid`` and is not being deleted."""
    fresh = await rt.client.get(API_VERSION, KIND, namespace, name)
    if fresh is None or fresh["metadata"].get("uid") != uid or fresh["metadata"].get("deletionTimestamp"):
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


async def record_pods(rt: Runtime, training: Mapping[str, Any], report: PodsReport) -> bool:
    """Write what the pods say (placement, start, a rejected config); True if one of those conditions changed.

    Recomputes the whole status from the last job seen, so the conditions
    and status.message stay consistent with the phase. Skipped while an
    apply is in flight or before the job watch has delivered the job (either
    will write the status soon, and the next tick retries).
    """
    uid = (training.get("metadata") or {}).get("uid", "")

    def pod_conditions(status: Mapping[str, Any]) -> list[Any]:
        return [c for c in status.get("conditions") or [] if c.get("type") in (SCHEDULABLE, PODS_STARTED, CONFIG_VALID)]

    async with rt.lock(uid):
        job = rt.jobs.get(uid)
        if job is None or uid in rt.applying:
            return False
        before = pod_conditions(rt.previous_status(training))
        await _sync_locked(rt, training, job, outcome=None, source="pods", pods=report, in_handler=False)
        return before != pod_conditions(rt.previous_status(training))


async def record_stall(
    rt: Runtime,
    training: Mapping[str, Any],
    stall: StallVerdict,
    *,
    restarts: int | None = None,
    events: list[EventSpec] | None = None,
) -> bool:
    """Write the stall check's verdict (and a new restart count); True if the Stalled condition changed."""
    uid = (training.get("metadata") or {}).get("uid", "")

    def stalled(status: Mapping[str, Any]) -> list[Any]:
        return [(c.get("status"), c.get("reason")) for c in status.get("conditions") or [] if c.get("type") == STALLED]

    async with rt.lock(uid):
        job = rt.jobs.get(uid)
        if job is None or uid in rt.applying:
            return False
        before = stalled(rt.previous_status(training))
        await _sync_locked(
            rt,
            training,
            job,
            outcome=None,
            source="stall",
            stall=stall,
            stall_restarts=restarts,
            events=events,
            in_handler=False,
        )
        return before != stalled(rt.previous_status(training))


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
            fields = {k: v for k, v in fields.items() if k in ("loss", "tokensPerSecond")}
        relevant = {k: previous[k] for k in fields if k in previous}
        if "checkpoint" in fields and "checkpoint" in previous:
            relevant["checkpoint"] = {"lastStep": (previous["checkpoint"] or {}).get("lastStep")}
        patch = merge_patch(relevant, dict(fields))
        # merge_patch deletes keys absent from `fields`; progress only ever adds or updates.
        patch = {k: v for k, v in patch.items() if v is not None}
        if not patch:
            return False
        response = await rt.client.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], patch)
        rt.wrote_status(uid, response, declared_subset(response.get("status")))
        rt.metrics.status_updates.labels("progress").inc()
        return True


async def _training_of_workload(rt: Runtime, workload: Mapping[str, Any]) -> Json | None:
    """The training whose job owns ``workload``, with that job recorded in ``rt.jobs``; None if not ours.

    At start-up the Workload watch may deliver before the job or training
    watch: what is not known yet is read, so a queued training's status never
    waits for the Workload's next change.
    """
    ref = owning_job(workload)
    if ref is None:
        return None
    namespace = (workload.get("metadata") or {}).get("namespace", "")
    # Our jobs are named after their training; the job's uid tells whether it is ours.
    training = rt.trainings.get((namespace, ref.get("name", "")))
    job = rt.jobs.get(training["metadata"].get("uid", "")) if training is not None else None
    if job is None or (job.get("metadata") or {}).get("uid") != ref.get("uid"):
        job_ref = backends.BY_KIND[ref["kind"]].ref
        fresh = await rt.client.get(job_ref.api_version, job_ref.kind, namespace, ref.get("name", ""))
        owner = owner_of(fresh) if fresh is not None else None
        if fresh is None or owner is None or fresh["metadata"].get("uid") != ref.get("uid"):
            return None
        training = await _owner_body(rt, namespace, owner)
        if training is None:
            return None
        rt.jobs[training["metadata"].get("uid", "")] = trim_job(fresh)
    return training


async def handle_workload_event(rt: Runtime, event_type: str | None, workload: Mapping[str, Any]) -> None:
    """A Kueue Workload of one of our jobs changed: keep the suspend intent, mirror it into the status."""
    training = await _training_of_workload(rt, workload)
    if training is None:
        return
    uid = training["metadata"].get("uid", "")
    if event_type == "DELETED":
        rt.workloads.pop(uid, None)
    else:
        rt.workloads[uid] = trim_workload(workload)
        await keep_suspend_intent(rt, training)
    async with rt.lock(uid):
        job = rt.jobs.get(uid)
        if job is None or uid in rt.applying:
            return  # the job is gone (its DELETED event re-creates it), or the apply in flight writes the status
        await _sync_locked(rt, training, job, outcome=None, source="workload")
