"""What every backend's job carries the same way: its metadata and Kueue's labels."""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL

from .. import naming


def queue_labels(spec: FSDPTrainingSpec) -> dict[str, str]:
    """Kueue's labels on the job: its LocalQueue and WorkloadPriorityClass."""
    labels = {}
    if spec.scheduling.queue is not None:
        labels[KUEUE_QUEUE_LABEL] = spec.scheduling.queue
    if spec.scheduling.priority_class is not None:
        labels[KUEUE_PRIORITY_LABEL] = spec.scheduling.priority_class
    return labels


def job_metadata(spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The metadata of the job, whichever its kind: the user's labels and annotations, Kueue's, ours."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**spec.pod.labels, **queue_labels(spec), **naming.labels(name, naming.TRAINING_JOB)},
        "annotations": {**spec.pod.annotations, **annotations},
    }
