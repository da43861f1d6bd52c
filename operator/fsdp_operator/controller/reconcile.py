"""What the handlers do: apply the rendered objects, mirror the job (whatever its backend) into the status.

Apply is server-side apply of objects with deterministic names, so running
it twice (a retry, a restart mid-reconcile, a resume) converges on the same
objects and never duplicates them. The status is a pure function of the
training, its job and the previous status (``status/compute.py``); the sync only
serialises its computation per training and writes it when it changed.

The parts, one module each: the in-memory ``state``, the status ``sync``,
the ``applies``, the ``job_events``, the pod loop's ``records`` and Kueue's
``workloads``. This module names them for the handlers.
"""

from __future__ import annotations

from .applies import (
    MAX_RETRY_DELAY,
    OPTIONAL_KINDS,
    apply_training,
    keep_suspend_intent,
    record_failure,
    rendered_objects,
    retry_delay,
    training_model,
)
from .job_events import JOB_DELETED_AFTER_END, RECREATE_BACKOFF, TERMINAL_PHASES, handle_job_event, recreate_job
from .records import record_pods, record_progress, record_stall
from .state import Runtime, newest_job, owner_body, owner_of, resource_version, trim, trim_job
from .sync import memory_plan_of, sync_locked, sync_status
from .workloads import handle_workload_event

__all__ = [
    "JOB_DELETED_AFTER_END",
    "MAX_RETRY_DELAY",
    "OPTIONAL_KINDS",
    "RECREATE_BACKOFF",
    "TERMINAL_PHASES",
    "Runtime",
    "apply_training",
    "handle_job_event",
    "handle_workload_event",
    "keep_suspend_intent",
    "memory_plan_of",
    "newest_job",
    "owner_body",
    "owner_of",
    "record_failure",
    "record_pods",
    "record_progress",
    "record_stall",
    "recreate_job",
    "rendered_objects",
    "resource_version",
    "retry_delay",
    "sync_locked",
    "sync_status",
    "training_model",
    "trim",
    "trim_job",
]
