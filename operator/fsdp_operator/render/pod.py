"""The trainer pod template: container, volumes, security, Karpenter placement."""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec, contract

from . import names
from .command import pod_command
from .env import container_env

Obj = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


def resources(spec: FSDPTrainingSpec) -> Obj:
    """Requests and limits of the trainer container.

    Extended resources (GPUs, EFA) need request == limit. Memory gets a limit
    equal to its request so the pod cannot be OOM-killed for a neighbour's
    overcommit; CPU gets no limit because CFS throttling of the DataLoader and
    NCCL proxy threads shows up directly as step time.
    """
    res = spec.resources
    requests: Obj = {}
    limits: Obj = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu
    if res.memory is not None:
        requests["memory"] = limits["memory"] = res.memory
    if res.gpus_per_node > 0:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = res.gpus_per_node
    if res.efa_per_node > 0:
        requests[EFA_RESOURCE] = limits[EFA_RESOURCE] = res.efa_per_node
    out: Obj = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def container_security(spec: FSDPTrainingSpec) -> Obj:
    capabilities: Obj = {"drop": ["ALL"]}
    if spec.resources.efa_per_node > 0:
        # EFA registers (pins) memory with the NIC; IPC_LOCK lifts the
        # RLIMIT_MEMLOCK cap on pinning. See docs/renderer.md for its limits
        # with a non-root user.
        capabilities["add"] = ["IPC_LOCK"]
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": capabilities,
    }


def pod_security() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": names.RUN_AS_USER,
        "runAsGroup": names.RUN_AS_GROUP,
        # The checkpoint PVC is group-writable for the trainer; OnRootMismatch
        # skips the recursive chown of a large volume on every pod start.
        "fsGroup": names.RUN_AS_GROUP,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volumes(spec: FSDPTrainingSpec, name: str) -> tuple[list[Obj], list[Obj]]:
    """(volumes, volumeMounts) of the trainer."""
    shm: Obj = {"medium": "Memory"}
    if spec.resources.shared_memory is not None:
        shm["sizeLimit"] = spec.resources.shared_memory
    claim = spec.checkpoint.claim_name
    checkpoints: Obj = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    vols = [
        {"name": "config", "configMap": {"name": names.config_map_name(name)}},
        # NCCL and DataLoader workers exchange tensors through /dev/shm; the
        # runtime's default 64Mi is far too small for either.
        {"name": "dshm", "emptyDir": shm},
        {"name": "checkpoints", **checkpoints},
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
    ]
    mounts = [
        {"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": names.SHM_DIR},
        {"name": "checkpoints", "mountPath": spec.checkpoint.dir},
        {"name": "tmp", "mountPath": names.TMP_DIR},
        {"name": "home", "mountPath": contract.HOME_DIR},
    ]
    return vols, mounts


def ports(spec: FSDPTrainingSpec) -> list[Obj]:
    out: list[Obj] = [{"name": names.RDZV_PORT_NAME, "containerPort": names.RDZV_PORT, "protocol": "TCP"}]
    if spec.metrics.enabled:
        out.append({"name": "metrics", "containerPort": spec.metrics.port, "protocol": "TCP"})
    return out


def affinity(spec: FSDPTrainingSpec, name: str) -> Obj:
    res = spec.resources

    def same_job(topology_key: str) -> Obj:
        # A fresh dict per use: shared sub-objects would become YAML anchors.
        return {"labelSelector": {"matchLabels": names.pod_selector(name)}, "topologyKey": topology_key}

    out: Obj = {
        # One pod per node, as spec.resources.nodes promises, even when a pod
        # asks for fewer GPUs than a node has.
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [same_job("kubernetes.io/hostname")]}
    }
    if res.efa_per_node > 0 and res.nodes > 1:
        # EFA's OS-bypass traffic does not leave its subnet (one per zone), so
        # all pods of the job land in the zone of the first one.
        out["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [same_job("topology.kubernetes.io/zone")]
        }
    if res.instance_types:
        out["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "In",
                                "values": list(res.instance_types),
                            }
                        ]
                    }
                ]
            }
        }
    return out


def pod_template(spec: FSDPTrainingSpec, name: str, annotations: dict[str, str]) -> Obj:
    vols, mounts = volumes(spec, name)
    container: Obj = {
        "name": names.CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        **pod_command(spec, name),
        "env": container_env(spec, name),
        "ports": ports(spec),
        "resources": resources(spec),
        "volumeMounts": mounts,
        "securityContext": container_security(spec),
        # A failed container's last log lines become its termination message:
        # a rejected config is then readable in the pod's status (and copied
        # into the training's ConfigValid condition) without `kubectl logs`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod: Obj = {
        # The trainer never calls the Kubernetes API. IRSA / Pod Identity
        # inject their own token volume, so this does not break S3 access.
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "nodeSelector": {
            "karpenter.sh/nodepool": spec.resources.node_pool,
            "karpenter.sh/capacity-type": spec.resources.capacity_type,
        },
        "affinity": affinity(spec, name),
        "containers": [container],
        "volumes": vols,
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.resources.gpus_per_node > 0:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "metadata": {
            "labels": names.labels(name, names.TRAINER),
            "annotations": {
                # A consolidation or drift that moves one rank restarts every
                # rank from the last checkpoint: Karpenter must leave the node be.
                "karpenter.sh/do-not-disrupt": "true",
                **annotations,
            },
        },
        "spec": pod,
    }
