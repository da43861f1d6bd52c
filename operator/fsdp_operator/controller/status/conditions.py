"""The status' condition types and reasons, and the one way a condition is built.

One module so that the status, the pod loop and the transition Events agree on
every name, and every condition's lastTransitionTime moves by the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fsdp_api.contract import GROUP
from fsdp_api.status import Condition

Json = Mapping[str, Any]
# A metav1.Condition's status (fsdp_api.status.Condition).
ConditionStatus = Literal["True", "False", "Unknown"]

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
# Whether the trainer's own check (run in each pod before torchrun) accepted
# the configuration: set False from a container that exited with the check's
# exit code, with the check's lines as the message.
CONFIG_VALID = "ConfigValid"
TRAINER_REJECTED_CONFIG = "TrainerRejectedConfig"
# Whether the step stopped advancing (controller/stall/ decides; spec.stall configures).
STALLED = "Stalled"
NO_PROGRESS = "NoProgress"
PROGRESSING = "Progressing"
STARTING = "Starting"
METRICS_UNREACHABLE = "MetricsUnreachable"  # status Unknown: past the limit, but the endpoint does not answer
# Whether the spec's memory plan fits the GPUs it asks for (fsdp_api.memory_plan).
FITS_MEMORY = "FitsMemory"
# The nodes under the pods, by their own conditions (node_health.py): reason of False.
NODES_HEALTHY = "NodesHealthy"
SUSPECT_NODE = "SuspectNode"
NO_SUSPECT_NODE = "NoSuspectNode"
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


def previous_conditions(previous: Json | None) -> dict[str, Json]:
    return {c.get("type", ""): c for c in ((previous or {}).get("conditions") or [])}


def as_status(value: str) -> ConditionStatus:
    """A condition status read from another object's condition; ValueError for anything else (as Condition's)."""
    if value == "True":
        return "True"
    if value == "False":
        return "False"
    if value == "Unknown":
        return "Unknown"
    raise ValueError(f"a condition status is True, False or Unknown, not {value!r}")


def condition(
    cond_type: str,
    status: ConditionStatus,
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
        status=status,
        reason=reason or cond_type,
        message=bounded(message or ""),
        observed_generation=generation,
        last_transition_time=transition_time,
    )
