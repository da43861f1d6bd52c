"""The export Job: ``fsdp-train export`` in the cluster, from a training's checkpoints to an S3 prefix.

A finished training's checkpoints sit where only the cluster reaches them: on
its claim (``checkpoint.claimName``), or in its remote tier
(``checkpoint.remote``; an emptyDir training's only copy). The Job runs the
training's own image with what its pods had to reach them: the claim mounted
read-only at ``checkpoint.dir``, the user's volumes, the environment
(``spec.env``: S3 endpoint and credentials) and service account (IRSA / Pod
Identity), and writes the Hugging Face model under a new S3 prefix.

It asks for no GPU and carries none of the training's GPU placement
(tolerations, node selector, Karpenter labels), so it runs on the cluster's
ordinary nodes and never makes Karpenter buy a GPU node for a CPU copy. Its
memory request covers the whole model in the export's dtype when the model's
size is known here (a preset, or a local config), else a default the caller
can raise. A pure function, like the rest of the renderer: the Job's name
suffix comes from the caller.

The memory is the model in fp32 whatever ``--dtype``: the export
materialises it in fp32 and casts each tensor as it writes.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTraining, FSDPTrainingSpec, contract
from fsdp_api.checkpoint_layout import step_dir_name
from fsdp_api.memory_plan import model_dims

from .. import naming
from .env import container_env
from .pod import container_security, pod_security, volumes

Obj = dict[str, Any]

EXPORT = "export"  # its app.kubernetes.io/component
# fp32: the export builds the model in fp32 and casts tensor by tensor while it saves.
MATERIALISED_BYTES = 4
# Python, torch and transformers themselves, and one tensor in flight beside the model.
BASE_MEMORY_BYTES = 3 << 30
DEFAULT_MEMORY = "16Gi"
CPU = "2"
# A finished export Job (and its pod, with the log) stays this long for `kubectl logs`.
KEEP_SECONDS = 24 * 3600
DEADLINE_SECONDS = 12 * 3600
MAX_NAME = 63


class ExportRefused(ValueError):
    """Why a training's checkpoints cannot be exported from the cluster (one line)."""


def export_source(spec: FSDPTrainingSpec, step: int | None = None) -> str:
    """What ``fsdp-train export --checkpoint`` reads in the Job: the claim's directory, else the remote tier."""
    if spec.runs_own_script:
        raise ExportRefused(
            "it runs a script of its own (spec.command): its checkpoints are the script's, which fsdp-train export "
            "does not read; export them with the script"
        )
    ckpt = spec.checkpoint
    if ckpt.claim_name:
        base = ckpt.dir
    elif ckpt.remote:
        base = ckpt.remote.rstrip("/")
    else:
        raise ExportRefused(
            "its checkpoints were in an emptyDir (no checkpoint.claimName, no checkpoint.remote) and went with its "
            "pods: nothing is left to export (give the next training a claim or a remote tier)"
        )
    return base if step is None else f"{base}/{step_dir_name(step)}"


def export_memory(spec: FSDPTrainingSpec) -> str:
    """The whole model in fp32 plus the process itself, when the model's size is known here."""
    dims, _ = model_dims(spec)
    if dims is None:
        return DEFAULT_MEMORY
    need = dims.num_params() * MATERIALISED_BYTES + BASE_MEMORY_BYTES
    return f"{-(-need // (1 << 30))}Gi"


def export_job_name(training_name: str, suffix: str) -> str:
    """``<training>-export-<suffix>``, the training's part cut so the whole is a valid name."""
    tail = f"-export-{suffix}"
    return training_name[: MAX_NAME - len(tail)].rstrip("-.") + tail


def export_job(
    training: FSDPTraining,
    output: str,
    *,
    suffix: str,
    step: int | None = None,
    dtype: str = "float32",
    fmt: str = "merged",
    memory: str | None = None,
    uid: str | None = None,
) -> Obj:
    """The batch/v1 Job that exports ``training``'s newest (or ``step``'s) checkpoint to ``output`` (s3://...)."""
    name = training.metadata.name
    assert name, "a training on the cluster has a name"
    spec = training.spec
    source = export_source(spec, step)
    vols, mounts = volumes(spec, name)
    # The checkpoints, the user's volumes (a base model's directory), /tmp and HOME; not the trainer's
    # config (its saved copy is in the checkpoint) nor /dev/shm (one process, no collectives).
    keep = {"checkpoints", "tmp", "home"} | {v.name for v in spec.pod.volumes}
    vols = [v for v in vols if v["name"] in keep]
    mounts = [m | ({"readOnly": True} if m["name"] == "checkpoints" else {}) for m in mounts if m["name"] in keep]
    memory = memory or export_memory(spec)
    command = ["fsdp-train", "export", "--checkpoint", source, "--output", output, "--dtype", dtype, "--format", fmt]
    container: Obj = {
        "name": EXPORT,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "env": [e for e in container_env(spec, name) if e["name"] not in _TRAINING_ONLY_ENV],
        "resources": {"requests": {"cpu": CPU, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": mounts,
        # The training's, less any capability it adds (EFA's IPC_LOCK): one process, no device.
        "securityContext": {**container_security(spec), "capabilities": {"drop": ["ALL"]}},
        # The export's one-line error becomes the pod's termination message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": vols,
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    labels = {**naming.labels(name, EXPORT)}
    metadata: Obj = {
        "name": export_job_name(name, suffix),
        "namespace": naming.namespace_of(training),
        "labels": labels,
        "annotations": {f"{contract.GROUP}/export-source": source, f"{contract.GROUP}/export-output": output},
    }
    if uid:
        # Deleted with its training; a finished one goes after KEEP_SECONDS anyway.
        metadata["ownerReferences"] = [
            {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": name, "uid": uid}
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            # An export that failed says why in one line; running it again gives the same line.
            "backoffLimit": 0,
            # A pod that cannot start (a ReadWriteOnce claim still mounted by the running training's node)
            # fails after this instead of waiting for ever.
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": KEEP_SECONDS,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


# Variables the trainer's launch reads (rendezvous, shutdown, metrics): an export is one plain process.
_TRAINING_ONLY_ENV = frozenset(
    {
        contract.ENV_SEPARATE_RDZV_STORE,
        contract.ENV_SHUTDOWN_TIMEOUT,
        contract.ENV_POD_IP,
        contract.ENV_METRICS_PORT,
        contract.ENV_CONFIG,
    }
)
