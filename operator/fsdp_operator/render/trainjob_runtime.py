"""The ClusterTrainingRuntime every TrainJob of ours references (backend: trainjob).

It holds what all FSDP jobs share and a TrainJob cannot set (``backends/trainjob.py``
says which fields go where): torchrun's ML policy, the restart policy, the
ports, the pods' identity and security, the scratch volumes. Rendered from the
same pod template as the jobs (a default training's), so the runtime and the
PyTorchJob pods cannot drift; the bundle ships it (kustomize/components/trainjob,
the Helm chart's trainJobRuntime) and a test checks that copy against this function.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import (
    CLUSTER_TRAINING_RUNTIME_KIND,
    HOME_DIR,
    RDZV_PORT,
    TMP_DIR,
    TRAINJOB,
    TRAINJOB_ANCESTOR_LABEL,
    TRAINJOB_ANCESTOR_TRAINER,
    TRAINJOB_API_VERSION,
    TRAINJOB_NODE,
    TRAINJOB_RUNTIME,
)

from .. import naming
from ..backends.trainjob import RUNTIME_CONTAINER_FIELDS, RUNTIME_POD_FIELDS
from ..launchers.torchrun import DEFAULT_MAX_RESTARTS
from .pod import container_security, pod_security, pod_template

Obj = dict[str, Any]

RDZV_PORT_NAME = "c10d"
# Every TrainJob sets its own image; this one only fills the required field.
PLACEHOLDER_IMAGE = "ghcr.io/fsdp-k8s/trainer:0.1.0"
# Container restarts (restartPolicy OnFailure: in place, same node and volume)
# the Job of the trainer nodes tolerates, all nodes together, before it fails.
# A runtime is shared, so this cannot scale with a job's node count as the
# PyTorchJob's backoffLimit does: room for DEFAULT_MAX_RESTARTS failures on up
# to four nodes.
BACKOFF_LIMIT = DEFAULT_MAX_RESTARTS * 4
# The scratch volumes every pod has at a fixed path; /dev/shm's size, the
# config and the checkpoints are per job (runtimePatches).
SCRATCH = (("tmp", TMP_DIR), ("home", HOME_DIR))


def cluster_training_runtime() -> Obj:
    # A default training's pod: the runtime holds its job-independent fields.
    default = FSDPTrainingSpec.model_validate({"image": PLACEHOLDER_IMAGE, "backend": TRAINJOB.name, "command": ["x"]})
    reference = pod_template(default, TRAINJOB_RUNTIME, {})["spec"]
    (ref_container,) = reference["containers"]
    container: Obj = {
        "name": TRAINJOB_NODE,
        "image": PLACEHOLDER_IMAGE,
        **{k: ref_container[k] for k in RUNTIME_CONTAINER_FIELDS},
        # Named for what it is here: the PyTorchJob's name is the training operator's.
        "ports": [
            {**p, "name": RDZV_PORT_NAME} if p["containerPort"] == RDZV_PORT else p for p in ref_container["ports"]
        ],
        "securityContext": container_security(default),
        "volumeMounts": [{"name": v, "mountPath": path} for v, path in SCRATCH],
    }
    pod: Obj = {
        **{k: reference[k] for k in RUNTIME_POD_FIELDS},
        # OnFailure: a crashed container restarts in place and resumes from the
        # last checkpoint, as with the PyTorchJob (backends/pytorchjob.py).
        "restartPolicy": "OnFailure",
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": default.pod.termination_grace_period_seconds,
        "containers": [container],
        "volumes": [{"name": v, "emptyDir": {}} for v, _ in SCRATCH],
    }
    return {
        "apiVersion": TRAINJOB_API_VERSION,
        "kind": CLUSTER_TRAINING_RUNTIME_KIND,
        "metadata": {
            "name": TRAINJOB_RUNTIME,
            "labels": {
                # What the Kubeflow SDK lists runtimes by.
                "trainer.kubeflow.org/framework": "torch",
                "app.kubernetes.io/name": TRAINJOB_RUNTIME,
                "app.kubernetes.io/part-of": naming.PART_OF,
            },
        },
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    # JobSet then re-creates all of the job's pods this many times (each
                    # restart resumes from the last checkpoint) before the TrainJob fails.
                    "failurePolicy": {"maxRestarts": DEFAULT_MAX_RESTARTS},
                    "replicatedJobs": [
                        {
                            "name": TRAINJOB_NODE,
                            "replicas": 1,
                            "template": {
                                "metadata": {"labels": {TRAINJOB_ANCESTOR_LABEL: TRAINJOB_ANCESTOR_TRAINER}},
                                "spec": {"backoffLimit": BACKOFF_LIMIT, "template": {"spec": pod}},
                            },
                        }
                    ],
                }
            },
        },
    }
