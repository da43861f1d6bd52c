"""The Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) that runs the trainer pods (backend: trainjob).

A TrainJob names a runtime and carries only what differs per job. The parts
every FSDP job shares (torchrun's ML policy, the restart policy, the ports,
the pod's identity and security, the scratch volumes) live in the
ClusterTrainingRuntime the bundle ships (``trainjob_runtime.py``). The per-job rest goes
where Trainer v2 lets a job set it: image, command, env, node and process
counts and resources in ``spec.trainer``; volumes, mounts, placement, labels
and the grace period in one ``spec.runtimePatches`` entry (a strategic merge
patch of the runtime's JobSet template, which Trainer v2 v2.3.0 applies in
pkg/runtime/core/trainingruntime.go).

Both backends render from the same pod template (``render/pod.py``), so a training
gets the same pods either way; ``runtime_fields`` lists what the runtime holds
instead, and a test checks the runtime holds exactly those values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import (
    CLUSTER_TRAINING_RUNTIME_KIND,
    JOB_COMPLETION_INDEX_ENV,
    TRAINER_GROUP,
    TRAINJOB,
    TRAINJOB_NODE,
    TRAINJOB_PATCH_MANAGER,
    TRAINJOB_RUNTIME,
    JobBackend,
)

from .base import Json
from .common import job_metadata
from .trainjob_keep import keep_immutable
from .trainjob_view import trainjob_status, trainjob_suspended

Obj = dict[str, Any]

# Pod fields a runtimePatch may set (PodSpecPatch, v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go).
PATCHED_POD_FIELDS = (
    "serviceAccountName",
    "volumes",
    "securityContext",
    "nodeSelector",
    "affinity",
    "tolerations",
    "terminationGracePeriodSeconds",
)
# Container fields a runtimePatch may set (ContainerPatch; env goes through spec.trainer.env).
PATCHED_CONTAINER_FIELDS = ("volumeMounts", "securityContext")
# Container fields spec.trainer carries.
TRAINER_FIELDS = {"image": "image", "command": "command", "args": "args", "env": "env", "resources": "resourcesPerNode"}
# Fields neither can set: the runtime holds them, the same for every job.
RUNTIME_POD_FIELDS = ("automountServiceAccountToken", "shareProcessNamespace")
RUNTIME_CONTAINER_FIELDS = ("imagePullPolicy", "ports", "terminationMessagePolicy")


def canonical_quantities(resources: Obj) -> Obj:
    """Quantities as strings, the form Trainer v2 stores them in.

    Its mutating webhook round-trips the TrainJob through Go types, which
    writes a quantity 1 as "1"; spec.trainer is immutable ("self == oldSelf"),
    so a later apply of the integer would be refused as a change.
    """
    return {kind: {name: str(q) for name, q in values.items()} for kind, values in resources.items()}


def trainer(spec: FSDPTrainingSpec, container: Obj) -> Obj:
    out: Obj = {ours: container[theirs] for theirs, ours in TRAINER_FIELDS.items() if theirs in container}
    if "resourcesPerNode" in out:
        out["resourcesPerNode"] = canonical_quantities(out["resourcesPerNode"])
    return {
        **out,
        "numNodes": spec.resources.nodes,
        # Explicit, like the PyTorchJob's nprocPerNode: Trainer v2's default
        # "auto" means one process per CPU of the request on a CPU node.
        "numProcPerNode": spec.procs_per_node(),
    }


def runtime_patch(template: Obj) -> Obj:
    """Our one runtimePatches entry: the pod metadata and the patchable pod and container fields."""
    pod = template["spec"]
    (container,) = pod["containers"]
    pod_patch: Obj = {k: pod[k] for k in PATCHED_POD_FIELDS if k in pod}
    pod_patch["containers"] = [
        {"name": container["name"], **{k: container[k] for k in PATCHED_CONTAINER_FIELDS if k in container}}
    ]
    return {
        "manager": TRAINJOB_PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": TRAINJOB_NODE,
                            "template": {"spec": {"template": {"metadata": template["metadata"], "spec": pod_patch}}},
                        }
                    ]
                }
            }
        },
    }


def trainjob(spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str], template: Obj) -> Obj:
    (container,) = template["spec"]["containers"]
    job_spec: Obj = {
        "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": CLUSTER_TRAINING_RUNTIME_KIND, "name": TRAINJOB_RUNTIME},
        "trainer": trainer(spec, container),
        "runtimePatches": [runtime_patch(template)],
    }
    if spec.scheduling.queue is None:
        # Queued: Kueue owns suspend (see backends/pytorchjob.run_policy).
        job_spec["suspend"] = spec.suspend
    if spec.run_policy.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
    return {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": job_metadata(spec, name, namespace, annotations),
        "spec": job_spec,
    }


# The reason of the Job controller's Event when it cannot create a pod (pkg/controller/job).
FAILED_CREATE = "FailedCreate"


class TrainJobBackend:
    """spec.backend: trainjob, run by Kubeflow Trainer v2 (through a JobSet)."""

    ref: JobBackend = TRAINJOB
    watch_id = "trainjob-status"
    kueue_integration = "trainer.kubeflow.org/trainjob"
    # jobsStatus counts JobSet's child Jobs, not pods.
    counts_pods = False
    # Node 0's rendezvous name is <hostname>.<subdomain>, which only cluster DNS resolves.
    node_index_env: str | None = JOB_COMPLETION_INDEX_ENV

    def render_job(
        self, spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str], template: Json
    ) -> Json:
        return trainjob(spec, name, namespace, annotations, template)

    def pod_host(self, name: str, index: int) -> str:
        """JobSet's pod hostname <jobset>-<replicated job>-<job index>-<pod index> under the JobSet's subdomain.

        The subdomain is the JobSet's headless Service, named like the JobSet
        (Trainer v2 names the JobSet after the TrainJob, and our one replicated
        job has one Job: index 0).
        """
        return f"{name}-{TRAINJOB_NODE}-0-{index}.{name}"

    def pod_creation_failures(self, job_name: str, job_uid: str) -> str:
        # The pods come from the batch Job JobSet makes for the trainer nodes
        # (<jobset>-<replicated job>-<index>), which records FailedCreate.
        return f"involvedObject.kind=Job,involvedObject.name={job_name}-{TRAINJOB_NODE}-0,reason={FAILED_CREATE}"

    def kubeflow_v1_view(self, job: Mapping[str, Any]) -> tuple[Json, Json]:
        return {"runPolicy": {"suspend": trainjob_suspended(job)}}, trainjob_status(job)

    def suspend_patch(self, suspend: bool) -> Json:
        return {"spec": {"suspend": suspend}}

    def keep_immutable(self, rendered: Json, existing: Json) -> tuple[Json, tuple[str, ...]]:
        return keep_immutable(rendered, existing)
