"""The Kubeflow PyTorchJob (kubeflow.org/v1) that runs the trainer pods.

Layout: one ``Worker`` replica type with ``replicas = nodes`` and no
``Master``. With a Master the training operator injects an init container
(an nslookup loop in a busybox-style image, with no securityContext) into
every worker, which breaks the restricted security profile of the pods, and
c10d rendezvous does not need a distinguished master. Worker 0 hosts the
rendezvous store instead. docs/renderer.md explains the choice.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, PYTORCHJOB_API_VERSION, PYTORCHJOB_KIND

from . import names
from .command import max_restarts
from .pod import pod_template

API_VERSION = PYTORCHJOB_API_VERSION
KIND = PYTORCHJOB_KIND


def backoff_limit(spec: FSDPTrainingSpec) -> int:
    """runPolicy.backoffLimit: tolerated failures (torchrun's max restarts) times the pod count.

    The training operator sums the container restart counts of all running
    pods against backoffLimit (pkg/core/job.go PastBackoffLimit), and one
    failure that torchrun cannot absorb restarts every pod's container (the
    others fail their next collective), so the limit scales with the pods.
    """
    return max(1, max_restarts(spec)) * spec.resources.nodes


def run_policy(spec: FSDPTrainingSpec) -> dict[str, Any]:
    policy: dict[str, Any] = {
        # Running: when the job ends, pods still running (e.g. ranks stuck
        # after rank 0 finished) are deleted so their GPU nodes can go, while
        # finished pods and their logs stay for inspection.
        "cleanPodPolicy": "Running",
        "backoffLimit": backoff_limit(spec),
        "suspend": spec.suspend,
        **spec.run_policy.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    if spec.scheduling.queue is not None:
        # Kueue owns suspend on a queued job: its webhook suspends it at creation,
        # it unsuspends it on admission and suspends it again on preemption (as
        # field manager "kueue"). Applying the field at all would take it back or
        # conflict; spec.suspend goes through the Workload's spec.active instead
        # (controller/queueing.py, docs/kueue.md).
        del policy["suspend"]
    return policy


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
        "labels": {**spec.pod.labels, **queue_labels(spec), **names.labels(name, names.TRAINING_JOB)},
        "annotations": {**spec.pod.annotations, **annotations},
    }


def elastic_policy(spec: FSDPTrainingSpec, name: str) -> dict[str, Any] | None:
    if spec.elastic is None:
        return None
    # No nProcPerNode here: it is deprecated, and the webhook forbids it
    # together with spec.nprocPerNode, which this job always sets.
    return {
        "rdzvBackend": "c10d",
        "rdzvId": name,
        "minReplicas": spec.elastic.min_nodes,
        "maxReplicas": spec.elastic.max_nodes,
        "maxRestarts": spec.elastic.max_restarts,
    }


def pytorchjob(spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
    job_spec: dict[str, Any] = {
        # Always an explicit integer: the training operator's default "auto"
        # makes torchrun start one process per visible GPU, or per CPU core on
        # a CPU node, whatever the spec asked for.
        "nprocPerNode": str(spec.procs_per_node()),
        "runPolicy": run_policy(spec),
    }
    elastic = elastic_policy(spec, name)
    if elastic is not None:
        job_spec["elasticPolicy"] = elastic
    job_spec["pytorchReplicaSpecs"] = {
        names.REPLICA_TYPE: {
            "replicas": spec.resources.nodes,
            # OnFailure: a crashed container restarts in place (same node,
            # cached image, attached PVC) and resumes from the last
            # checkpoint; a pod that is evicted or loses its node is recreated
            # by the operator. ExitCode would fail the job on torchrun's exit
            # code 1, which is what torchrun returns for any worker failure.
            "restartPolicy": "OnFailure",
            "template": pod_template(spec, name, annotations),
        }
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": job_metadata(spec, name, namespace, annotations),
        "spec": job_spec,
    }
