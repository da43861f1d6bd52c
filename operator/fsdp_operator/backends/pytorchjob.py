"""The Kubeflow PyTorchJob (kubeflow.org/v1) that runs the trainer pods.

Layout: one ``Worker`` replica type with ``replicas = nodes`` and no
``Master``. With a Master the training operator injects an init container
(an nslookup loop in a busybox-style image, with no securityContext) into
every worker, which breaks the restricted security profile of the pods, and
c10d rendezvous does not need a distinguished master. Worker 0 hosts the
rendezvous store instead. docs/renderer.md explains the choice.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import PYTORCHJOB, WORKER_REPLICA, JobBackend

from .. import launchers, naming
from .base import FAILED_CREATE_POD
from .common import job_metadata

Json = dict[str, Any]


def backoff_limit(spec: FSDPTrainingSpec) -> int:
    """runPolicy.backoffLimit: tolerated failures (the launcher's in-pod restarts) times the pod count.

    The training operator sums the container restart counts of all running
    pods against backoffLimit (pkg/core/job.go PastBackoffLimit), and one
    failure that torchrun cannot absorb restarts every pod's container (the
    others fail their next collective), so the limit scales with the pods.
    """
    return max(1, launchers.of_spec(spec).restarts(spec)) * spec.resources.nodes


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


def pytorchjob(
    spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str], template: Json
) -> dict[str, Any]:
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
        WORKER_REPLICA: {
            "replicas": spec.resources.nodes,
            # OnFailure: a crashed container restarts in place (same node,
            # cached image, attached PVC) and resumes from the last
            # checkpoint; a pod that is evicted or loses its node is recreated
            # by the operator. ExitCode would fail the job on torchrun's exit
            # code 1, which is what torchrun returns for any worker failure.
            "restartPolicy": "OnFailure",
            "template": template,
        }
    }
    return {
        "apiVersion": PYTORCHJOB.api_version,
        "kind": PYTORCHJOB.kind,
        "metadata": job_metadata(spec, name, namespace, annotations),
        "spec": job_spec,
    }


class PyTorchJobBackend:
    """spec.backend: pytorchjob, run by the Kubeflow training operator."""

    ref: JobBackend = PYTORCHJOB
    watch_id = "job-status"
    kueue_integration = "kubeflow.org/pytorchjob"
    # The training operator counts the pods of each replica type.
    counts_pods = True
    # Node 0's rendezvous name is its pod's hostname (pod_host).
    node_index_env: str | None = None

    def render_job(
        self, spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str], template: Json
    ) -> Json:
        return pytorchjob(spec, name, namespace, annotations, template)

    def pod_host(self, name: str, index: int) -> str:
        # The pod's own headless Service, named like the pod.
        return naming.pod_name(name, index)

    def pod_creation_failures(self, job_name: str, job_uid: str) -> str:
        # The training operator records a refused pod (quota, admission webhook,
        # Pod Security) only as a FailedCreatePod Event on the PyTorchJob.
        return f"involvedObject.uid={job_uid},reason={FAILED_CREATE_POD}"

    def kubeflow_v1_view(self, job: Mapping[str, Any]) -> tuple[Json, Json]:
        spec = {"runPolicy": copy.deepcopy(((job.get("spec") or {}).get("runPolicy")) or {})}
        return spec, copy.deepcopy(dict(job.get("status") or {}))

    def suspend_patch(self, suspend: bool) -> Json:
        return {"spec": {"runPolicy": {"suspend": suspend}}}

    def keep_immutable(self, rendered: Json, existing: Json) -> tuple[Json, tuple[str, ...]]:
        # The training operator's webhook (v1.9.4) checks an update like a create, with no
        # immutable field of ours; Kueue's placement on admission is in fields we do not set.
        return rendered, ()
