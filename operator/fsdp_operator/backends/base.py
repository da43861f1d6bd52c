"""The protocol every backend implements: what the renderer, the controller and the watches ask of a job kind.

A backend is one kind of job an FSDPTraining can run as (spec.backend). The
renderer gives it the pod template and gets the job back; the controller asks
it how its pods are named and found, what its status says in the Kubeflow v1
vocabulary ``status/compute.py`` reads, and where the refusal to create a pod shows.
Nothing outside this package asks which backend it is talking to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import RDZV_PORT, JobBackend

Json = dict[str, Any]

# The training operator's Event reason when it cannot create a pod
# (kubeflow/training-operator v1.9 pkg/controller.v1/control/pod_control.go);
# the PodsStarted condition reuses it for a pod that a backend could not create.
FAILED_CREATE_POD = "FailedCreatePod"


class Backend(Protocol):
    """One job kind: its API identity (``ref``), its job, its pods' names, its status."""

    ref: JobBackend  # group, version, kind, plural, container name, pod labels
    # kopf handler id of the job watch (one watch per backend).
    watch_id: str
    # Kueue's name for the integration that manages this kind (its controller's --integrations entry).
    kueue_integration: str
    # Whether the status' replicaStatuses count pods (True) or something coarser, like child Jobs (False).
    counts_pods: bool
    # The variable holding a pod's node index where node 0's rendezvous name is not its own
    # hostname (so that node 0 hosts the rendezvous without looking that name up); None
    # where it is (node 0 finds its own name in its /etc/hosts).
    node_index_env: str | None

    def render_job(
        self, spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str], template: Json
    ) -> Json:
        """The job that runs ``template`` (the trainer pod template) ``spec.resources.nodes`` times."""
        ...

    def pod_host(self, name: str, index: int) -> str:
        """The DNS name of node ``index``'s pod of job ``name``."""
        ...

    def pod_creation_failures(self, job_name: str, job_uid: str) -> str:
        """A field selector for the Events that say a pod of the job could not be created."""
        ...

    def kubeflow_v1_view(self, job: Mapping[str, Any]) -> tuple[Json, Json]:
        """The job's ``spec`` (``runPolicy.suspend``) and ``status``, as a PyTorchJob would say them."""
        ...

    def suspend_patch(self, suspend: bool) -> Json:
        """The merge patch that suspends (or resumes) the job."""
        ...

    def keep_immutable(self, rendered: Json, existing: Json) -> tuple[Json, tuple[str, ...]]:
        """The job to apply over ``existing``: ``rendered`` with the fields the job's API would refuse
        to change taken from ``existing``, and the paths of those that differed."""
        ...


def rendezvous_endpoint(backend: Backend, name: str) -> str:
    # Node 0's name; torchrun on that pod finds that the name resolves to its
    # own address and hosts the c10d store there.
    return f"{backend.pod_host(name, 0)}:{RDZV_PORT}"
