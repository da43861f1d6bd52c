"""A job (+ the FSDPTraining's own facts) → FSDPTraining status, as pure functions.

Nothing here talks to the API server, so every mapping rule is unit-tested
(tests/operator/status/test_status.py) and the handlers only fetch, call and patch.
The status is a list of condition builders (``EARLY_CONDITIONS``, then the
phase, then ``CONDITIONS``) and one precedence table for status.message
(``MESSAGE_PRECEDENCE``). The condition names are in ``status/conditions.py``, what
the pods say in ``status/pod_report.py``, the stored form and its patch in
``status/patch.py``, the Events of a change in ``status/transitions.py``; their names
are re-exported here for the handlers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from fsdp_api.durations import format_duration
from fsdp_api.status import (
    CheckpointStatus,
    Condition,
    ExcludedNode,
    FSDPTrainingStatus,
    NodeIncidents,
    Phase,
    TopologyStatus,
)

from ...backends import FAILED_CREATE_POD, JobView, job_view
from ..queueing import ADMITTED, QueueState
from .condition_builders import CONDITIONS, EARLY_CONDITIONS, fits_memory, stall_state
from .conditions import (
    APPLY_FAILED,
    CONFIG_VALID,
    FOREIGN_OBJECT,
    GENERATION_ANNOTATION,
    INVALID_SPEC,
    JOB_RECREATE_FAILED,
    MAX_MESSAGE,
    NODES_HEALTHY,
    PODS_STARTED,
    RECONCILED,
    SCHEDULABLE,
    STALLED,
    bounded,
    previous_conditions,
)
from .inputs import ACTIVE, TERMINAL, WAITING, Inputs, Observations, ReconcileOutcome, TrainingFacts
from .patch import declared_subset, merge_patch, status_document, status_patch
from .pod_report import PodsReport, Scheduling, Start, config_rejection, pod_scheduling, pod_start, pods_report
from .transitions import EventSpec, transition_events

Json = Mapping[str, Any]
Entry = TypeVar("Entry", ExcludedNode, NodeIncidents)


def rfc3339(t: datetime) -> str:
    """Kubernetes' form of a time: UTC, whole seconds, ``Z``."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    return rfc3339(datetime.now(UTC))


def job_phase(job: Json | JobView | None) -> tuple[Phase, str]:
    """The phase and its message, by precedence: terminal states, then suspension, then activity."""
    if job is None:
        return "Pending", "waiting for the job to be created"
    view = job_view(job)
    true = view.true_conditions()
    kind, name = view.kind, view.name
    for phase in TERMINAL:
        if phase in true:
            return phase, true[phase].message or f"{kind} {name} {phase.lower()}"
    if "Suspended" in true or view.suspend_requested:
        msg = true["Suspended"].message if "Suspended" in true else ""
        return "Suspended", msg or f"{kind} {name} is suspended"
    for phase in ACTIVE:
        if phase in true:
            return phase, true[phase].message or f"{kind} {name} is {phase.lower()}"
    created = true.get("Created")
    return "Created", (created.message if created else "") or f"{kind} {name} created; waiting for its pods"


def observed_generation(job: Json | JobView | None, previous: Json | None) -> int | None:
    if job is not None:
        raw = job_view(job).annotations.get(GENERATION_ANNOTATION)
        if raw is not None and str(raw).isdigit():
            return int(raw)
    prev = (previous or {}).get("observedGeneration")
    return int(prev) if prev is not None else None


# status.message, highest precedence first: (condition type, its status (None: any), the phases it
# speaks for). The first that holds gives the message; else the phase's own message.
MESSAGE_PRECEDENCE: tuple[tuple[str, str | None, tuple[Phase, ...]], ...] = (
    (STALLED, "True", ACTIVE),
    (NODES_HEALTHY, "False", ACTIVE),
    # Why the job crash-loops, and then why it failed: more useful than the backoff limit.
    (CONFIG_VALID, None, (*WAITING, "Failed")),
    (PODS_STARTED, "False", WAITING),
    (SCHEDULABLE, "False", WAITING),
)


def _phase(inp: Inputs, early: list[Condition]) -> tuple[Phase, str]:
    """The phase and its message from the job, corrected by the queue and a failed apply."""
    phase, message = job_phase(inp.job)
    training = inp.training
    by_type = {c.type: c for c in early}
    if training.queue is not None and phase == "Suspended" and not training.suspend:
        # Suspended by Kueue, not by the user: waiting for admission, or requeued after an eviction.
        phase = "Queued"
        admitted = by_type.get(ADMITTED)
        message = admitted.message if admitted is not None and admitted.message else f"queued in {training.queue}"
    reconciled = by_type.get(RECONCILED)
    if inp.job is None and reconciled is not None and reconciled.status == "False":
        if reconciled.reason == INVALID_SPEC:
            # Retrying cannot fix a spec the renderer rejects: without a job, the training has failed.
            phase = "Failed"
        # Nothing to mirror yet: what stops the job from being created is the news.
        message = reconciled.message
    return phase, message


def status_message(phase: Phase, phase_message: str, conditions: list[Condition]) -> str:
    """status.message: the first entry of MESSAGE_PRECEDENCE that holds, else the phase's message."""
    by_type = {c.type: c for c in conditions}
    for cond_type, status, phases in MESSAGE_PRECEDENCE:
        cond = by_type.get(cond_type)
        if cond is not None and (status is None or cond.status == status) and phase in phases:
            return cond.message
    return phase_message


def compute_status(
    training: TrainingFacts,
    job: Json | JobView | None,
    previous: Json | None,
    seen: Observations | None = None,
) -> FSDPTrainingStatus:
    """The whole declared status, from the training, its job (None if absent), the previous status and the news.

    ``seen`` is what the controller saw or decided since the previous status
    (``Observations``: each part left None keeps what the previous status says of it).
    Metric-derived fields (step, loss, tokens/s, last checkpoint step) are
    carried over: only the scraper sets them, except that a Succeeded job
    has by construction trained and checkpointed its last step (below).
    """
    seen = seen or Observations()
    view = job_view(job) if job is not None else None
    prev = previous or {}
    inp = Inputs(
        training=training,
        job=view,
        previous=prev,
        prev_conds=previous_conditions(previous),
        generation=observed_generation(view, previous),
        now=seen.now or now_rfc3339(),
        seen=seen,
    )
    early = [c for build in EARLY_CONDITIONS for c in build(inp)]
    phase, message = _phase(inp, early)
    inp = replace(inp, phase=phase)
    conditions = early + [c for build in CONDITIONS for c in build(inp)]
    message = status_message(phase, message, conditions)

    prev_ckpt = prev.get("checkpoint") or {}
    step, last_checkpoint = prev.get("step"), prev_ckpt.get("lastStep")
    if phase == "Succeeded" and training.max_steps is not None and inp.generation == training.generation:
        # The trainer exits 0 only after training step maxSteps and finishing its
        # checkpoint (the final one is unconditional), and by then its metrics
        # endpoint is gone: the last scrape may be several steps behind.
        step = last_checkpoint = training.max_steps
    completion = _carried_completion(prev, phase, step, training.max_steps)
    return FSDPTrainingStatus(
        phase=phase,
        message=bounded(message),
        observed_generation=inp.generation,
        conditions=conditions,
        job_name=(view.name if view else "") or prev.get("jobName") or training.name,
        nodes=training.nodes,
        gpus=training.gpus,
        replica_statuses=dict(view.replicas) if view is not None else {},
        start_time=view.start_time if view is not None else None,
        completion_time=view.completion_time if view is not None else None,
        step=step,
        loss=prev.get("loss"),
        tokens_per_second=prev.get("tokensPerSecond"),
        **completion,
        tracker_runs=prev.get("trackerRuns"),  # the scraper's, like step and loss: a run's page stays its page
        router=prev.get("router"),  # the scraper's too
        stall_restarts=seen.stall_restarts if seen.stall_restarts is not None else prev.get("stallRestarts"),
        excluded_nodes=_entries(ExcludedNode, seen.excluded_nodes, prev.get("excludedNodes")),
        node_incidents=_entries(NodeIncidents, seen.node_incidents, prev.get("nodeIncidents")),
        checkpoint=CheckpointStatus(
            dir=training.checkpoint_dir,
            ephemeral=training.checkpoint_claim is None and training.checkpoint_remote is None,
            last_step=last_checkpoint,
            remote=training.checkpoint_remote,
            last_uploaded_step=prev_ckpt.get("lastUploadedStep"),
        ),
        memory=fits_memory(seen.memory, prev, inp.prev_conds, training.generation, inp.now)[1],
        topology=_topology(seen.queue),
    )


def _entries(model: type[Entry], new: list[dict[str, Any]] | None, kept: Any) -> list[Entry] | None:
    """A list of the status (the nodes excluded, the incidents): the new one, else the previous status' own."""
    entries = new if new is not None else kept
    return None if entries is None else [model.model_validate(e) for e in entries]


def _topology(queue: QueueState | None) -> TopologyStatus | None:
    """Kueue's assigned domains, while admitted: an eviction clears the assignment, a readmission sets a new one."""
    placed = queue.placement if queue is not None else None
    return TopologyStatus(level=placed.level, domains=list(placed.domains[:64])) if placed else None


def _carried_completion(prev: Mapping[str, Any], phase: str, step: int | None, max_steps: int | None) -> dict[str, Any]:
    """Progress as the scraper last wrote it; the time left only while Running, nothing left once Succeeded."""
    if phase == "Succeeded" and step is not None and step == max_steps:
        return {"progress_percentage": 100, "estimated_remaining_seconds": 0, "remaining": format_duration(0)}
    carried = {"progress_percentage": prev.get("progressPercentage")}
    if phase == "Running":
        carried |= {
            "estimated_remaining_seconds": prev.get("estimatedRemainingSeconds"),
            "remaining": prev.get("remaining"),
        }
    return carried


__all__ = [
    "APPLY_FAILED",
    "CONFIG_VALID",
    "FAILED_CREATE_POD",
    "FOREIGN_OBJECT",
    "GENERATION_ANNOTATION",
    "INVALID_SPEC",
    "JOB_RECREATE_FAILED",
    "MAX_MESSAGE",
    "NODES_HEALTHY",
    "PODS_STARTED",
    "SCHEDULABLE",
    "STALLED",
    "EventSpec",
    "Inputs",
    "Observations",
    "PodsReport",
    "ReconcileOutcome",
    "Scheduling",
    "Start",
    "TrainingFacts",
    "bounded",
    "compute_status",
    "config_rejection",
    "declared_subset",
    "job_phase",
    "merge_patch",
    "now_rfc3339",
    "observed_generation",
    "pod_scheduling",
    "pod_start",
    "pods_report",
    "rfc3339",
    "stall_state",
    "status_document",
    "status_message",
    "status_patch",
    "transition_events",
]
