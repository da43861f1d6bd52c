"""The trainer pod template: container, volumes, security, Karpenter placement."""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec, contract
from fsdp_api.spec import DO_NOT_DISRUPT

from .. import naming
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
    NCCL proxy threads shows up directly as step time. Without ``cpu`` or
    ``memory`` in the spec, both come from the instance types
    (``fsdp_api.pod_resources``), so the pod has a memory request.
    """
    res = spec.resources
    requests: Obj = {}
    limits: Obj = {}
    cpu = res.effective_cpu()
    memory = res.effective_memory()
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = limits["memory"] = memory
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
        "runAsUser": naming.RUN_AS_USER,
        "runAsGroup": naming.RUN_AS_GROUP,
        # The checkpoint PVC is group-writable for the trainer; OnRootMismatch
        # skips the recursive chown of a large volume on every pod start.
        "fsGroup": naming.RUN_AS_GROUP,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volumes(spec: FSDPTrainingSpec, name: str) -> tuple[list[Obj], list[Obj]]:
    """(volumes, volumeMounts) of the trainer."""
    shm: Obj = {"medium": "Memory"}
    # Its pages count against the memory limit: bounded by default (a quarter of it).
    shm_size = spec.resources.effective_shared_memory()
    if shm_size is not None:
        shm["sizeLimit"] = shm_size
    claim = spec.checkpoint.claim_name
    checkpoints: Obj = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    vols: list[Obj] = [
        # NCCL and DataLoader workers exchange tensors through /dev/shm; the
        # runtime's default 64Mi is far too small for either.
        {"name": "dshm", "emptyDir": shm},
        {"name": "checkpoints", **checkpoints},
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
    ]
    mounts: list[Obj] = [
        {"name": "dshm", "mountPath": contract.SHM_DIR},
        {"name": "checkpoints", "mountPath": spec.checkpoint.dir},
        {"name": "tmp", "mountPath": contract.TMP_DIR},
        {"name": "home", "mountPath": contract.HOME_DIR},
    ]
    if not spec.runs_own_script:
        # The built-in trainer's config (a script of your own has none).
        vols.insert(0, {"name": "config", "configMap": {"name": naming.config_map_name(name)}})
        mounts.insert(0, {"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True})
    user = spec.pod
    vols += [v.model_dump(by_alias=True, exclude_none=True, mode="json") for v in user.volumes]
    mounts += [m.model_dump(by_alias=True, exclude_none=True, mode="json") for m in user.volume_mounts]
    return vols, mounts


def ports(spec: FSDPTrainingSpec) -> list[Obj]:
    out: list[Obj] = [{"name": contract.PYTORCHJOB_PORT_NAME, "containerPort": contract.RDZV_PORT, "protocol": "TCP"}]
    if spec.metrics.enabled:
        out.append({"name": "metrics", "containerPort": spec.metrics.port, "protocol": "TCP"})
    return out


def affinity(spec: FSDPTrainingSpec, name: str) -> Obj:
    res = spec.resources

    def same_job(topology_key: str) -> Obj:
        # A fresh dict per use: shared sub-objects would become YAML anchors.
        return {"labelSelector": {"matchLabels": naming.pod_selector(name)}, "topologyKey": topology_key}

    out: Obj = {
        # One pod per node, as spec.resources.nodes promises, even when a pod
        # asks for fewer GPUs than a node has.
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [same_job(contract.HOSTNAME_LABEL)]}
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
    if spec.pod.affinity is not None:
        merge_affinity(out, spec.pod.affinity.model_dump(by_alias=True, exclude_none=True, mode="json"))
    return out


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def merge_affinity(ours: Obj, user: Obj) -> None:
    """Add ``spec.pod.affinity`` to ours, in place, so that both hold.

    Lists of pod (anti-)affinity terms and of preferences are ANDed or summed
    by the scheduler, so the user's are appended. Required node selector terms
    are ORed, so our one term (the instance types) is ANDed into each of the
    user's terms instead.
    """
    for kind in ("podAffinity", "podAntiAffinity"):
        for when in (REQUIRED, PREFERRED):
            terms = user.get(kind, {}).get(when)
            if terms:
                ours.setdefault(kind, {}).setdefault(when, []).extend(terms)
    node = user.get("nodeAffinity", {})
    if node.get(PREFERRED):
        ours.setdefault("nodeAffinity", {}).setdefault(PREFERRED, []).extend(node[PREFERRED])
    if node.get(REQUIRED):
        mine = ours.get("nodeAffinity", {}).get(REQUIRED, {}).get("nodeSelectorTerms", [{}])[0]
        terms = [
            {"matchExpressions": [*mine.get("matchExpressions", []), *term["matchExpressions"]]}
            for term in node[REQUIRED]["nodeSelectorTerms"]
        ]
        ours.setdefault("nodeAffinity", {})[REQUIRED] = {"nodeSelectorTerms": terms}


def node_selector(spec: FSDPTrainingSpec) -> Obj:
    """Karpenter's NodePool and capacity type (placement karpenter), then ``spec.pod.nodeSelector``."""
    out: Obj = {}
    if spec.resources.placement == "karpenter":
        out["karpenter.sh/nodepool"] = spec.resources.node_pool
        out["karpenter.sh/capacity-type"] = spec.resources.capacity_type
    return {**out, **spec.pod.node_selector}


def tolerations(spec: FSDPTrainingSpec) -> list[Obj]:
    out: list[Obj] = []
    if spec.resources.gpus_per_node > 0:
        out.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return out + [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in spec.pod.tolerations]


def template_annotations(spec: FSDPTrainingSpec, annotations: dict[str, str]) -> dict[str, str]:
    """The pods' annotations: the user's, Karpenter's do-not-disrupt (placement karpenter), then ours."""
    out = dict(spec.pod.annotations)
    if spec.resources.placement == "karpenter":
        # A consolidation or drift that moves one rank restarts every
        # rank from the last checkpoint: Karpenter must leave the node be.
        out[DO_NOT_DISRUPT] = "true"
    topology = spec.scheduling.topology
    if topology is not None:
        # Kueue reads its PodSet's topology request from the pod template and places the pods in
        # the order of their replica (PyTorchJob) or completion (JobSet) index.
        required = topology.mode == "required"
        key = contract.KUEUE_REQUIRED_TOPOLOGY_ANNOTATION if required else contract.KUEUE_PREFERRED_TOPOLOGY_ANNOTATION
        out[key] = topology.node_label()
    return {**out, **annotations}


def pod_template(spec: FSDPTrainingSpec, name: str, annotations: dict[str, str], uid: str | None = None) -> Obj:
    vols, mounts = volumes(spec, name)
    container: Obj = {
        "name": naming.container_name(spec.backend),
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        **pod_command(spec, name),
        "env": container_env(spec, name, uid),
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
        # Omitted when empty (placement none and no pod.nodeSelector).
        "nodeSelector": node_selector(spec),
        "affinity": affinity(spec, name),
        "containers": [container],
        "volumes": vols,
        # Room for the checkpoint the trainer saves on SIGTERM (docs/renderer.md).
        "terminationGracePeriodSeconds": spec.pod.termination_grace_period_seconds,
        # The pause container is then PID 1, not the trainer's command. The kernel drops a
        # signal to a PID namespace's init that has no handler for it, so a SIGTERM (a pod
        # deleted, preempted or drained) in the first moments of the container, before
        # Python had installed its handler, was lost: the pod ran on until the grace
        # period's SIGKILL. As an ordinary process the command dies of it at once.
        "shareProcessNamespace": True,
    }
    if not pod["nodeSelector"]:
        del pod["nodeSelector"]
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.pod.priority_class_name:
        pod["priorityClassName"] = spec.pod.priority_class_name
    tols = tolerations(spec)
    if tols:
        pod["tolerations"] = tols
    return {
        "metadata": {
            "labels": {**spec.pod.labels, **naming.labels(name, naming.TRAINER)},
            "annotations": template_annotations(spec, annotations),
        },
        "spec": pod,
    }
