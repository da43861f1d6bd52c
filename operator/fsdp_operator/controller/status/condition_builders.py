"""The status' conditions, one small builder each: ``EARLY_CONDITIONS`` decide the phase, ``CONDITIONS`` follow it.

A builder reads the computation's ``Inputs`` and returns the conditions it
owns (none, one, or a few), in the order they are listed in the status. A new
condition is one builder here, one entry in a tuple below and, if it should
speak for the training, one row of ``status.MESSAGE_PRECEDENCE``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fsdp_api.memory_plan import MemoryPlan
from fsdp_api.status import Condition, MemoryStatus, Phase

from ...backends import JobView
from ..bodies import ConditionView
from ..queueing import ADMITTED, EVICTED, QueueState
from ..stall import StallVerdict
from .conditions import (
    CHECKPOINTS_PERSISTENT,
    CONFIG_VALID,
    FITS_MEMORY,
    KUBEFLOW_CONDITIONS,
    METRICS_UNREACHABLE,
    NO_PROGRESS,
    NO_SUSPECT_NODE,
    NODES_HEALTHY,
    PODS_STARTED,
    PROGRESSING,
    RECONCILED,
    SCHEDULABLE,
    SCHEDULED,
    STALLED,
    STARTING,
    SUSPECT_NODE,
    TRAINER_REJECTED_CONFIG,
    ConditionStatus,
    as_status,
    condition,
)
from .inputs import PODLESS, Inputs, TrainingFacts
from .pod_report import Scheduling, Start

Json = Mapping[str, Any]
Builder = Callable[[Inputs], list[Condition]]


def _one(cond: Condition | None) -> list[Condition]:
    return [cond] if cond is not None else []


def _reconciled(inp: Inputs) -> list[Condition]:
    """Reconciled: the last apply's outcome; a job event (no outcome) keeps the previous one."""
    outcome, training = inp.seen.outcome, inp.training
    if outcome is not None:
        status: ConditionStatus = "True" if outcome.ok else "False"
        return [
            condition(RECONCILED, status, outcome.reason, outcome.message, training.generation, inp.prev_conds, inp.now)
        ]
    return _one(Condition.model_validate(inp.prev_conds[RECONCILED]) if RECONCILED in inp.prev_conds else None)


def _checkpoints_persistent(inp: Inputs) -> list[Condition]:
    training = inp.training
    if training.checkpoint_remote:
        where = f"on PVC {training.checkpoint_claim}" if training.checkpoint_claim else "in an emptyDir"
        return [
            condition(
                CHECKPOINTS_PERSISTENT,
                "True",
                "RemoteTier",
                f"checkpoints in {training.checkpoint_dir} {where}, each copied to {training.checkpoint_remote}",
                training.generation,
                inp.prev_conds,
                inp.now,
            )
        ]
    if training.checkpoint_claim:
        return [
            condition(
                CHECKPOINTS_PERSISTENT,
                "True",
                "PersistentVolumeClaim",
                f"checkpoints in {training.checkpoint_dir} on PVC {training.checkpoint_claim}",
                training.generation,
                inp.prev_conds,
                inp.now,
            )
        ]
    return [
        condition(
            CHECKPOINTS_PERSISTENT,
            "False",
            "EphemeralStorage",
            f"no spec.checkpoint.claimName: checkpoints in {training.checkpoint_dir} live in an emptyDir "
            "and are lost with the pods, so a restarted job starts from scratch",
            training.generation,
            inp.prev_conds,
            inp.now,
        )
    ]


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
    status: ConditionStatus = "True" if queue.admitted else "False"
    out = [condition(ADMITTED, status, queue.reason, queue.message, training.generation, previous, now)]
    if queue.evicted is not None:
        ev = ConditionView.of(queue.evicted)
        out.append(
            condition(
                EVICTED,
                as_status(ev.status or "Unknown"),
                ev.reason or EVICTED,
                ev.message,
                training.generation,
                previous,
                now,
            )
        )
    return out


def _queue(inp: Inputs) -> list[Condition]:
    return _queue_conditions(inp.training, inp.seen.queue, inp.prev_conds, inp.now)


def _schedulable_condition(
    phase: Phase, scheduling: Scheduling | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """The Schedulable condition: set from the pods, kept until they say otherwise.

    A suspended job has no pods, so the condition goes (it is re-evaluated on
    resume). A job that succeeded had all its pods placed. A failed job keeps
    the last word: "could not be scheduled" may be why it failed.
    """
    if phase in PODLESS:
        return None
    if scheduling is not None:
        return condition(
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
        return condition(SCHEDULABLE, "True", SCHEDULED, "the job's pods ran", generation, previous, now)
    return Condition.model_validate(old)


def _start_condition(
    phase: Phase, start: Start | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """PodsStarted: set from the pods, kept until they say otherwise; gone while suspended (no pods)."""
    if phase in PODLESS:
        return None
    if start is not None:
        status: ConditionStatus = "True" if start.started else "False"
        return condition(PODS_STARTED, status, start.reason, start.message, generation, previous, now)
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
        return condition(CONFIG_VALID, "False", TRAINER_REJECTED_CONFIG, rejection, generation, previous, now)
    old = previous.get(CONFIG_VALID)
    if old is None or old.get("observedGeneration") != generation:
        return None
    return Condition.model_validate(old)


def stall_state(stall: StallVerdict) -> tuple[ConditionStatus, str]:
    """The Stalled condition's status and reason for a verdict."""
    if stall.unreachable:
        return "Unknown", METRICS_UNREACHABLE
    if stall.stalled:
        return "True", NO_PROGRESS
    return "False", PROGRESSING if stall.step is not None else STARTING


def _stall_condition(
    phase: Phase, stall: StallVerdict | None, previous: Mapping[str, Json], generation: int, now: str
) -> Condition | None:
    """Stalled: set by the stall check while the job runs; gone once it is suspended or has succeeded."""
    if phase in (*PODLESS, "Succeeded"):
        return None
    if stall is not None:
        status, reason = stall_state(stall)
        return condition(STALLED, status, reason, stall.message(), generation, previous, now)
    old = previous.get(STALLED)
    return Condition.model_validate(old) if old is not None else None


def fits_memory(
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
    verdicts: dict[bool | None, tuple[ConditionStatus, str]] = {
        True: ("True", "Fits"),
        False: ("False", "DoesNotFit"),
        None: ("Unknown", "NoEstimate"),
    }
    status, reason = verdicts[fits]
    memory = MemoryStatus(
        estimated_bytes_per_gpu=plan.total_bytes,
        gpu_memory_bytes=plan.gpu_memory_bytes,
        instance_type=plan.gpu.name if plan.gpu is not None else None,
    )
    return condition(FITS_MEMORY, status, reason, plan.summary(), generation, prev_conds, now), memory


def _schedulable(inp: Inputs) -> list[Condition]:
    scheduling = inp.seen.scheduling
    return _one(_schedulable_condition(inp.phase, scheduling, inp.prev_conds, inp.training.generation, inp.now))


def _started(inp: Inputs) -> list[Condition]:
    return _one(_start_condition(inp.phase, inp.seen.start, inp.prev_conds, inp.training.generation, inp.now))


def _config_valid(inp: Inputs) -> list[Condition]:
    return _one(_config_condition(inp.seen.rejection, inp.prev_conds, inp.training.generation, inp.now))


def _fits_memory(inp: Inputs) -> list[Condition]:
    return _one(fits_memory(inp.seen.memory, inp.previous, inp.prev_conds, inp.training.generation, inp.now)[0])


def _stalled(inp: Inputs) -> list[Condition]:
    return _one(_stall_condition(inp.phase, inp.seen.stall, inp.prev_conds, inp.training.generation, inp.now))


def _job_conditions(job: JobView, generation: int | None, previous: Mapping[str, Json], now: str) -> list[Condition]:
    by_type = job.by_type()
    out = []
    for cond_type in KUBEFLOW_CONDITIONS:
        c = by_type.get(cond_type)
        if c is None:
            if cond_type == "Suspended" and job.suspend_requested:
                # Requested in the job's spec, not yet acknowledged by the training operator.
                out.append(
                    condition(
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
            condition(
                cond_type,
                as_status(c.status),
                c.reason or cond_type,
                c.message,
                generation,
                previous,
                now,
                transition_time=c.transition_time,
            )
        )
    return out


def _nodes_healthy(inp: Inputs) -> list[Condition]:
    """NodesHealthy: what the nodes under the pods say of themselves; kept between looks, gone without pods."""
    if inp.phase in PODLESS or inp.phase in ("Succeeded", "Failed"):
        return []
    health = inp.seen.nodes
    if health is None:
        kept = inp.prev_conds.get(NODES_HEALTHY)
        return _one(Condition.model_validate(kept) if kept is not None else None)
    verdict: tuple[ConditionStatus, str] = ("True", NO_SUSPECT_NODE) if health.healthy else ("False", SUSPECT_NODE)
    status, reason = verdict
    return [
        condition(NODES_HEALTHY, status, reason, health.message(), inp.training.generation, inp.prev_conds, inp.now)
    ]


def _mirrored(inp: Inputs) -> list[Condition]:
    """The job's own conditions (Kubeflow's), as its backend reports them."""
    return _job_conditions(inp.job, inp.generation, inp.prev_conds, inp.now) if inp.job is not None else []


# Conditions the phase depends on, in the order they are listed in the status.
EARLY_CONDITIONS: tuple[Builder, ...] = (_reconciled, _checkpoints_persistent, _queue)
# Conditions that depend on the phase, listed after the early ones in this order.
CONDITIONS: tuple[Builder, ...] = (
    _schedulable,
    _started,
    _config_valid,
    _fits_memory,
    _stalled,
    _nodes_healthy,
    _mirrored,
)
