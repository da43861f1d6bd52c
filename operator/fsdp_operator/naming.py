"""Names and labels shared by every rendered object and every backend.

One module, below both the renderer and the backends, so that the PodMonitor's
selector, the pod labels, the job's labels and the rendezvous host can never
disagree about how a training's objects are named. Names the API's contract
already holds (ports, replica types, fixed paths) are used from there, not
renamed here.
"""

from __future__ import annotations

from fsdp_api import FSDPTraining
from fsdp_api.contract import BACKENDS, GROUP, WORKER_REPLICA

MANAGED_BY = "fsdp-operator"
APP_NAME = "fsdptraining"
PART_OF = "fsdp-k8s"
# The label every object of one FSDPTraining carries; selectors use it.
JOB_LABEL = f"{GROUP}/job"
CHECKPOINTS_ANNOTATION = f"{GROUP}/checkpoints"

# Components, as app.kubernetes.io/component values.
TRAINER = "trainer"
TRAINER_CONFIG = "trainer-config"
TRAINING_JOB = "training-job"
METRICS = "metrics"
NETWORK_POLICY = "network-policy"

# A fixed non-root identity: the image needs no matching /etc/passwd entry
# because HOME is set explicitly. fsGroup makes a block-device PVC (EBS)
# writable, but CSI drivers of shared volumes (FSx for Lustre, EFS) do not
# apply it: there the volume itself must let uid 1000 write (docs/eks-checkpoint-storage.md).
RUN_AS_USER = 1000
RUN_AS_GROUP = 1000


def namespace_of(training: FSDPTraining) -> str:
    return training.metadata.namespace or "default"


def config_map_name(name: str) -> str:
    return f"{name}-trainer"


def container_name(backend: str) -> str:
    """The trainer container's name: each backend's controller requires its own."""
    return BACKENDS[backend].container


def pod_name(name: str, index: int) -> str:
    """Pod (and headless Service) name the training operator gives replica ``index``."""
    return f"{name}-{WORKER_REPLICA.lower()}-{index}"


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        JOB_LABEL: name,
    }


def pod_selector(name: str) -> dict[str, str]:
    return {JOB_LABEL: name, "app.kubernetes.io/component": TRAINER}
