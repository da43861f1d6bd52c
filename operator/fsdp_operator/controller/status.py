"""PyTorchJob (+ the FSDPTraining's own facts) → FSDPTraining status, as pure functions.

Nothing here talks to the API server, so every mapping rule is unit-tested
(tests/operator/test_status.py) and the handlers only fetch, call and patch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fsdp_api.contract import CONFIG_ERROR_EXIT_CODE, CONFIG_ERROR_HEADER, GROUP, TRAINER_CONTAINERS
from fsdp_api.memory_plan import MemoryPlan
from fsdp_api.spec import CheckpointSpec, ResourcesSpec
from fsdp_api.status import CheckpointStatus, Condition, FSDPTrainingStatus, MemoryStatus, Phase

from ..backends import FAILED_CREATE_POD, JobView, job_view
from .queueing import ADMITTED, EVICTED, QueueState
from .stall import StallVerdict

# The PyTorchJob carries the FSDPTraining generation it was rendered from, so
# a status computed from a job event knows which spec it reflects.
GENERATION_ANNOTATION = f"{GROUP}/generation"

# Kubeflow's JobConditionType values, in the order they are mirrored.
KUBEFLOW_CONDITIONS = ("Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
# Conditions the operator owns (not copied from the PyTorchJob).
RECONCILED = "Reconciled"
CHECKPOINTS_PERSISTENT = "CheckpointsPersistent"
# Whether the job's pods have been placed on nodes (from the pods' PodScheduled condition).
SCHEDULABLE = "Schedulable"
SCHEDULED = "Scheduled"
# Whether the job's pods were created and their containers could start: False
# for what does not fix itself by waiting (a pod the API server refuses, an
# image that cannot be pulled, a missing Secret or ConfigMap key).
PODS_STARTED = "PodsStarted"
STARTED = "Started"
# Waiting reasons of a container the kubelet cannot start (kubelet
# images/types.go and kuberuntime); ContainerCreating and CrashLoopBackOff are
# not among them: the first passes, the second is the process's own failure.
START_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
# Whether the trainer's own check (run in each pod before torchrun) accepted
# the configuration: set False from a container that exited with the check's
# exit code, with the check's lines as the message.
CONFIG_VALID = "ConfigValid"
TRAINER_REJECTED_CONFIG = "TrainerRejectedConfig"
# Whether the step stopped advancing (controller/stall.py decides; spec.stall configures).
STALLED = "Stalled"
NO_PROGRESS = "NoProgress"
PROGRESSING = "Progressing"
STARTING = "Starting"
# Whether the spec's memory plan fits the GPUs it asks for (fsdp_api.memory_plan).
FITS_MEMORY = "FitsMemory"
# Reconciled=False reasons: a spec the renderer rejects, or an API error applying the objects.
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
# An object of the rendered name exists and belongs to someone else: never taken over.
FOREIGN_OBJECT = "ForeignObject"
# Messages from outside (API errors, the job's conditions) are cut to this many
# characters: an Event allows no more, and a status should stay readable.
MAX_MESSAGE = 1024


def bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


# A job deleted under a live training could not be re-created (yet): retried with backoff.
JOB_RECREATE_FAILED = "JobRecreateFailed"

Json = Mapping[str, Any]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class TrainingFacts:
    """What the status needs from the FSDPTraining object itself."""

    name: str
    namespace: str
    uid: str
    generation: int
    suspend: bool
    nodes: int
    gpus: int
    checkpoint_dir: str
    checkpoint_claim: str | None
    max_steps: int | None = None
    queue: str | None = None  # spec.scheduling.queue: Kueue owns the job's suspension

    @classmethod
    def from_body(cls, body: Json) -> TrainingFacts:
        """Read the facts leniently: defaults come from the API model, never a validation error.

        Status must be computable even for a spec the renderer rejects, so
        this does not validate the whole spec.
        """
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        resources = spec.get("resources") or {}
        checkpoint = spec.get("checkpoint") or {}
        max_steps = (spec.get("training") or {}).get("maxSteps")
        nodes = int(resources.get("nodes", ResourcesSpec.model_fields["nodes"].default))
        gpus_per_node = int(resources.get("gpusPerNode", ResourcesSpec.model_fields["gpus_per_node"].default))
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            suspend=bool(spec.get("suspend", False)),
            nodes=nodes,
            gpus=nodes * gpus_per_node,
            checkpoint_dir=str(checkpoint.get("dir", CheckpointSpec.model_fields["dir"].default)),
            checkpoint_claim=checkpoint.get("claimName"),
            max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
            queue=(spec.get("scheduling") or {}).get("queue"),
        )


@dataclass(frozen=True)
class ReconcileOutcome:
    """Result of the last attempt to apply the rendered objects (the Reconciled condition)."""

    ok: bool
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Scheduling:
    """What the job's pods say about their placement (the Schedulable condition)."""

    scheduled: bool
    reason: str
    message: str


def _pod_scheduled(pod: Json) -> Json | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return c
    return None


def pod_scheduling(pods: Iterable[Json], expected: int) -> Scheduling | None:
    """Scheduling state of a job from its pods; None while it is not known yet.

    The scheduler records every failed attempt on the pod as PodScheduled=False
    (reason Unschedulable, message "0/N nodes are available: ..."), so any such
    pod explains why the job cannot start. "Scheduled" needs all ``expected``
    pods to exist and be bound; pods not yet seen by the scheduler (no
    condition) or not yet created leave the answer open.
    """
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    stuck = []
    bound = 0
    for pod in live:
        cond = _pod_scheduled(pod)
        if cond is not None and cond.get("status") == "False":
            stuck.append((str((pod.get("metadata") or {}).get("name", "")), cond))
        elif (cond is not None and cond.get("status") == "True") or (pod.get("spec") or {}).get("nodeName"):
            bound += 1
    if stuck:
        stuck.sort(key=lambda item: item[0])
        name, cond = stuck[0]
        reason = str(cond.get("reason") or "Unschedulable")
        detail = str(cond.get("message") or reason)
        count = f"{len(stuck)} of {len(live)} pods" if len(live) > 1 else "the pod"
        return Scheduling(False, reason, f"{count} cannot be scheduled: {name}: {detail}")
    if live and bound == len(live) and bound >= expected:
        return Scheduling(True, SCHEDULED, f"all {bound} pods are scheduled")
    return None


def _check_lines(message: str) -> str:
    """The check's error lines from a termination message (a log tail), as one line.

    The tail may start with earlier output (library warnings): only the lines
    after the last CONFIG_ERROR_HEADER are the check's. Without the header,
    the last non-empty line is the best guess.
    """
    lines = message.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].rstrip().endswith(CONFIG_ERROR_HEADER):
            found = [line.strip() for line in lines[i + 1 :] if line.startswith("  ") and line.strip()]
            if found:
                return "; ".join(found)
    rest = [line.strip() for line in lines if line.strip()]
    return rest[-1] if rest else ""


def config_rejection(pods: Iterable[Json]) -> str | None:
    """Why the trainer rejected its configuration, from the first pod whose trainer container says so; else None.

    Read from the current or the last termination of the trainer container
    (OnFailure restarts it in place, so the failure is usually lastState).
    """
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    for pod in sorted(live, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") not in TRAINER_CONTAINERS:
                continue
            for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                term = state.get("terminated") or {}
                if term.get("exitCode") == CONFIG_ERROR_EXIT_CODE:
                    name = (pod.get("metadata") or {}).get("name", "")
                    detail = _check_lines(str(term.get("message") or "")) or (
                        f"exit code {CONFIG_ERROR_EXIT_CODE}; the pod's log says why"
                    )
                    return f"the trainer rejected its configuration in pod {name}: {detail}"
    return None


@dataclass(frozen=True)
class Start:
    """Whether the job's pods exist and their containers started (the PodsStarted condition)."""

    started: bool
    reason: str
    message: str


def pod_start(pods: Iterable[Json], expected: int, create_failure: str | None = None) -> Start | None:
    """Start state of a job from its pods (and the training operator's last pod-creation error); None while open.

    A container waiting for a reason in START_FAILURES explains the job, as
    does ``create_failure`` while pods are missing. "Started" needs all
    ``expected`` pods with their trainer container running or run.
    """
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    stuck = []
    for pod in sorted(live, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        status = pod.get("status") or {}
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in START_FAILURES:
                stuck.append((str((pod.get("metadata") or {}).get("name", "")), cs.get("name", ""), waiting))
    if stuck:
        pod, container, waiting = stuck[0]
        count = f"{len({s[0] for s in stuck})} of {len(live)} pods" if len(live) > 1 else "the pod"
        detail = waiting.get("message") or waiting["reason"]
        return Start(False, str(waiting["reason"]), f"{count} cannot start: {pod}: container {container}: {detail}")
    if create_failure and len(live) < expected:
        return Start(False, FAILED_CREATE_POD, f"the training operator cannot create the pods: {create_failure}")

    def started(pod: Json) -> bool:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") in TRAINER_CONTAINERS:
                state = cs.get("state") or {}
                return "running" in state or "terminated" in state or "terminated" in (cs.get("lastState") or {})
        return False

    if live and len(live) >= expected and all(started(p) for p in live):
        return Start(True, STARTED, f"the trainer containers of all {len(live)} pods have started")
    return None


@dataclass(frozen=True)
class PodsReport:
    """What one look at a job's pods says: placement, start, and a configuration the trainer rejected."""

    scheduling: Scheduling | None
    rejection: str | None = None
    start: Start | None = None


def pods_report(pods: Iterable[Json], expected: int, create_failure: str | None = None) -> PodsReport:
    pods = list(pods)
    return PodsReport(pod_scheduling(pods, expected), config_rejection(pods), pod_start(pods, expected, create_failure))


_TERMINAL: tuple[Phase, ...] = ("Failed", "Succeeded")
_ACTIVE: tuple[Phase, ...] = ("Restarting", "Running")


def job_phase(job: Json | JobView | None) -> tuple[Phase, str]:
    """The phase and its message, by precedence: terminal states, then suspension, then activity."""
    if job is None:
        return "Pending", "waiting for the job to be created"
    view = job_view(job)
    true = view.true_conditions()
    kind, name = view.kind, view.name
    for phase in _TERMINAL:
        if phase in true:
            return phase, true[phase].message or f"{kind} {name} {phase.lower()}"
    if "Suspended" in true or view.suspend_requested:
        msg = true["Suspended"].message if "Suspended" in true else ""
        return "Suspended", msg or f"{kind} {name} is suspended"
    for phase in _ACTIVE:
        if phase in true:
            return phase, true[phase].message or f"{kind} {name} is {phase.lower()}"
    created = true.get("Created")
    return "Created", (created.message if created else "") or f"{kind} {name} created; waiting for its pods"


def _previous_conditions(previous: Json | None) -> dict[str, Json]:
    return {c.get("type", ""): c for c in ((previous or {}).get("conditions") or [])}


def _condition(
    cond_type: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    previous: Mapping[str, Json],
    now: str,
    transition_time: str | None = None,
) -> Condition:
    """A metav1.Condition whose lastTransitionTime only moves when the status flips."""
    old = previous.get(cond_type)
    if transition_time is None:
        same = old is not None and old.get("status") == status and old.get("lastTransitionTime")
        transition_time = str(old["lastTransitionTime"]) if same and old else now
    return Condition(
        type=cond_type,
        status=status,  # type: ignore[arg-type]
        reason=reason or cond_type,
        message=bounded(message or ""),
        observed_generation=generation,
        last_transition_time=transition_time,
    )


def _job_conditions(job: JobView, generation: int | None, previous: Mapping[str, Json], now: str) -> list[Condition]:
    by_type = job.by_type()
    out = []
    for cond_type in KUBEFLOW_CONDITIONS:
        c = by_type.get(cond_type)
        if c is None:
            if cond_type == "Suspended" and job.suspend_requested:
                # Requested in the job's spec, not yet acknowledged by the training operator.
                out.append(
                    _condition(
                        "Suspended",
                        "True",
                        "SuspendRequested",
                        f"suspend is set on the {job.kind}",
                        generation,
                        previous,
                        now,
                    )
                )
            continue
        out.append(
            _condition(
                cond_type,
                c.status,
                c.reason or cond_type,
                c.message,
                generation,
                previous,
                now,
                transition_time=c.transition_time,
            )
        )
    return out


# Phases in which pods are expected to be (or become) scheduled: a placement
# problem is the most useful thing the status can say then.
_WAITING: tuple[Phase, ...] = ("Pending", "Created", "Restarting", "Running")
# Phases in which the job has no pods: conditions about pods go until it runs again.
_PODLESS: tuple[Phase, ...] = ("Suspended", "Queued")


def _schedulable_condition(
    phase: Phase, scheduling: Scheduling | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """The Schedulable condition: set from the pods, kept until they say otherwise.

    A suspended job has no pods, so the condition goes (it is re-evaluated on
    resume). A job that succeeded had all its pods placed. A failed job keeps
    the last word: "could not be scheduled" may be why it failed.
    """
    if phase in _PODLESS:
        return None
    if scheduling is not None:
        return _condition(
            SCHEDULABLE,
            "True" if scheduling.scheduled else "False",
            scheduling.reason,
            scheduling.message,
            generation,
            previous,
            now,
        )
    old = previous.get(SCHEDULABLE)
    if old is None:
        return None
    if phase == "Succeeded" and old.get("status") != "True":
        return _condition(SCHEDULABLE, "True", SCHEDULED, "the job's pods ran", generation, previous, now)
    return Condition.model_validate(old)


def _start_condition(
    phase: Phase, start: Start | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """PodsStarted: set from the pods, kept until they say otherwise; gone while suspended (no pods)."""
    if phase in _PODLESS:
        return None
    if start is not None:
        status = "True" if start.started else "False"
        return _condition(PODS_STARTED, status, start.reason, start.message, generation, previous, now)
    old = previous.get(PODS_STARTED)
    return Condition.model_validate(old) if old is not None else None


def _config_condition(
    rejection: str | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """ConfigValid=False once a pod showed the check's rejection; kept for that generation only.

    A new generation (the user's fix) renders a new config: the old verdict
    no longer applies, and only a new rejection brings the condition back.
    """
    if rejection is not None:
        return _condition(CONFIG_VALID, "False", TRAINER_REJECTED_CONFIG, rejection, generation, previous, now)
    old = previous.get(CONFIG_VALID)
    if old is None or old.get("observedGeneration") != generation:
        return None
    return Condition.model_validate(old)


def stall_state(stall: StallVerdict) -> tuple[str, str]:
    """The Stalled condition's status and reason for a verdict."""
    if stall.stalled:
        return "True", NO_PROGRESS
    return "False", PROGRESSING if stall.step is not None else STARTING


def _stall_condition(
    phase: Phase, stall: StallVerdict | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """Stalled: set by the stall check while the job runs; gone once it is suspended or has succeeded."""
    if phase in (*_PODLESS, "Succeeded"):
        return None
    if stall is not None:
        status, reason = stall_state(stall)
        return _condition(STALLED, status, reason, stall.message(), generation, previous, now)
    old = previous.get(STALLED)
    return Condition.model_validate(old) if old is not None else None


def _memory(
    plan: MemoryPlan | None, previous: Json, prev_conds: Mapping[str, Json], generation: int, now: str
) -> tuple[Condition | None, MemoryStatus | None]:
    """FitsMemory and status.memory from a new plan (made when the spec is applied); else the previous ones."""
    if plan is None:
        old = prev_conds.get(FITS_MEMORY)
        kept = previous.get("memory")
        return (
            Condition.model_validate(old) if old is not None else None,
            MemoryStatus.model_validate(kept) if kept else None,
        )
    fits = plan.fits
    status, reason = {True: ("True", "Fits"), False: ("False", "DoesNotFit"), None: ("Unknown", "NoEstimate")}[fits]
    memory = MemoryStatus(
        estimated_bytes_per_gpu=plan.total_bytes,
        gpu_memory_bytes=plan.gpu_memory_bytes,
        instance_type=plan.gpu.name if plan.gpu is not None else None,
    )
    return _condition(FITS_MEMORY, status, reason, plan.summary(), generation, prev_conds, now), memory


def _queue_conditions(
    training: TrainingFacts, queue: QueueState | None, previous: Mapping[str, Json], now: str
) -> list[Condition]:
    """Admitted (Kueue's verdict, or why it waits) and Evicted (the last eviction) of a queued training.

    ``queue`` None (no Workload read on this path) keeps the previous ones.
    """
    if training.queue is None:
        return []
    if queue is None:
        return [Condition.model_validate(previous[t]) for t in (ADMITTED, EVICTED) if t in previous]
    status = "True" if queue.admitted else "False"
    out = [_condition(ADMITTED, status, queue.reason, queue.message, training.generation, previous, now)]
    if queue.evicted is not None:
        ev = queue.evicted
        out.append(
            _condition(
                EVICTED,
                str(ev.get("status") or "Unknown"),
                str(ev.get("reason") or EVICTED),
                str(ev.get("message") or ""),
                training.generation,
                previous,
                now,
            )
        )
    return out


def observed_generation(job: Json | JobView | None, previous: Json | None) -> int | None:
    if job is not None:
        raw = job_view(job).annotations.get(GENERATION_ANNOTATION)
        if raw is not None and str(raw).isdigit():
            return int(raw)
    prev = (previous or {}).get("observedGeneration")
    return int(prev) if prev is not None else None


def compute_status(
    training: TrainingFacts,
    job_body: Json | JobView | None,
    previous: Json | None,
    *,
    outcome: ReconcileOutcome | None = None,
    scheduling: Scheduling | None = None,
    rejection: str | None = None,
    start: Start | None = None,
    stall: StallVerdict | None = None,
    stall_restarts: int | None = None,
    memory: MemoryPlan | None = None,
    queue: QueueState | None = None,
    now: str | None = None,
) -> FSDPTrainingStatus:
    """The whole declared status, from the training, its PyTorchJob (None if absent) and the previous status.

    ``outcome`` is the result of an apply attempt; None (a job event) keeps
    the previous Reconciled condition. ``scheduling`` is what the pods say
    about their placement; None keeps the previous Schedulable condition.
    ``rejection`` is the trainer's verdict on its config, read from the
    pods; None keeps a previous ConfigValid=False of the same generation.
    ``start`` is whether the pods exist and their containers started; None
    keeps the previous PodsStarted condition. ``stall`` is the stall check's
    verdict; None keeps the previous Stalled condition. ``stall_restarts``
    replaces the count of restarts for stalls (None keeps it). ``memory`` is
    the spec's memory plan, made when it is applied; None keeps the previous
    FitsMemory condition and status.memory. ``queue`` is what Kueue's Workload
    says of a queued training; None keeps its previous Admitted and Evicted.
    Metric-derived fields (step, loss, tokens/s, last checkpoint step) are
    carried over: only the scraper sets them, except that a Succeeded job
    has by construction trained and checkpointed its last step (below).
    """
    now = now or now_rfc3339()
    job = job_view(job_body) if job_body is not None else None
    prev = previous or {}
    prev_conds = _previous_conditions(previous)
    generation = observed_generation(job, previous)

    conditions: list[Condition] = []
    if outcome is not None:
        conditions.append(
            _condition(
                RECONCILED,
                "True" if outcome.ok else "False",
                outcome.reason,
                outcome.message,
                training.generation,
                prev_conds,
                now,
            )
        )
    elif RECONCILED in prev_conds:
        conditions.append(Condition.model_validate(prev_conds[RECONCILED]))
    reconciled = conditions[0] if conditions else None

    if training.checkpoint_claim:
        conditions.append(
            _condition(
                CHECKPOINTS_PERSISTENT,
                "True",
                "PersistentVolumeClaim",
                f"checkpoints in {training.checkpoint_dir} on PVC {training.checkpoint_claim}",
                training.generation,
                prev_conds,
                now,
            )
        )
    else:
        conditions.append(
            _condition(
                CHECKPOINTS_PERSISTENT,
                "False",
                "EphemeralStorage",
                f"no spec.checkpoint.claimName: checkpoints in {training.checkpoint_dir} live in an emptyDir "
                "and are lost with the pods, so a restarted job starts from scratch",
                training.generation,
                prev_conds,
                now,
            )
        )
    phase, message = job_phase(job)
    queue_conditions = _queue_conditions(training, queue, prev_conds, now)
    conditions += queue_conditions
    if training.queue is not None and phase == "Suspended" and not training.suspend:
        # Suspended by Kueue, not by the user: waiting for admission, or requeued after an eviction.
        phase = "Queued"
        admitted = next((c for c in queue_conditions if c.type == ADMITTED), None)
        message = admitted.message if admitted is not None and admitted.message else f"queued in {training.queue}"
    if job is None and reconciled is not None and reconciled.status == "False" and reconciled.reason == INVALID_SPEC:
        # Retrying cannot fix a spec the renderer rejects: without a job, the training has failed.
        phase, message = "Failed", reconciled.message
    elif job is None and reconciled is not None and reconciled.status == "False":
        # Nothing to mirror yet: what stops the job from being created is the news.
        message = reconciled.message
    schedulable = _schedulable_condition(phase, scheduling, prev_conds, training.generation, now)
    if schedulable is not None:
        conditions.append(schedulable)
        if schedulable.status == "False" and phase in _WAITING:
            message = schedulable.message
    started = _start_condition(phase, start, prev_conds, training.generation, now)
    if started is not None:
        conditions.append(started)
        if started.status == "False" and phase in _WAITING:
            message = started.message
    config = _config_condition(rejection, prev_conds, training.generation, now)
    if config is not None:
        conditions.append(config)
        if phase in (*_WAITING, "Failed"):
            # Why the job crash-loops, and then why it failed: more useful than the backoff limit.
            message = config.message
    fits, memory_status = _memory(memory, prev, prev_conds, training.generation, now)
    if fits is not None:
        conditions.append(fits)
    stalled = _stall_condition(phase, stall, prev_conds, training.generation, now)
    if stalled is not None:
        conditions.append(stalled)
        if stalled.status == "True" and phase in _ACTIVE:
            message = stalled.message
    if job is not None:
        conditions += _job_conditions(job, generation, prev_conds, now)

    prev_ckpt = prev.get("checkpoint") or {}
    step, last_checkpoint = prev.get("step"), prev_ckpt.get("lastStep")
    if phase == "Succeeded" and training.max_steps is not None and generation == training.generation:
        # The trainer exits 0 only after training step maxSteps and finishing its
        # checkpoint (the final one is unconditional), and by then its metrics
        # endpoint is gone: the last scrape may be several steps behind.
        step = last_checkpoint = training.max_steps
    return FSDPTrainingStatus(
        phase=phase,
        message=bounded(message),
        observed_generation=generation,
        conditions=conditions,
        job_name=(job.name if job else "") or prev.get("jobName") or training.name,
        nodes=training.nodes,
        gpus=training.gpus,
        replica_statuses=dict(job.replicas) if job is not None else {},
        start_time=job.start_time if job is not None else None,
        completion_time=job.completion_time if job is not None else None,
        step=step,
        loss=prev.get("loss"),
        tokens_per_second=prev.get("tokensPerSecond"),
        stall_restarts=stall_restarts if stall_restarts is not None else prev.get("stallRestarts"),
        checkpoint=CheckpointStatus(
            dir=training.checkpoint_dir,
            ephemeral=training.checkpoint_claim is None,
            last_step=last_checkpoint,
        ),
        memory=memory_status,
    )


def status_document(status: FSDPTrainingStatus) -> dict[str, Any]:
    """The status as stored: camelCase, unset fields left out."""
    return status.model_dump(by_alias=True, mode="json", exclude_none=True)


def declared_subset(previous: Json | None) -> dict[str, Any]:
    """Only the fields FSDPTrainingStatus declares (anything else would be pruned anyway)."""
    keys = {f.alias or n for n, f in FSDPTrainingStatus.model_fields.items()}
    return {k: v for k, v in (previous or {}).items() if k in keys}


def merge_patch(old: Json | None, new: Json) -> dict[str, Any]:
    """An RFC 7386 JSON merge patch turning ``old`` into ``new`` (empty: nothing to do).

    Lists are replaced whole, as merge patch does; keys missing from ``new``
    are deleted with null, so stale replica types or times disappear.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before or key not in old:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def status_patch(previous: Json | None, status: FSDPTrainingStatus) -> dict[str, Any]:
    """The merge patch for the status subresource; ``{}`` when the stored status is already right."""
    return merge_patch(declared_subset(previous), status_document(status))


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
    old_conds = _previous_conditions(previous)
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
