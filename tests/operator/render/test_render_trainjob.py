"""spec.backend: trainjob renders a TrainJob whose pods are the PyTorchJob's pods (docs/backends.md).

A TrainJob does not carry a pod template: Kubeflow Trainer v2.3.0 builds the
pods from the ClusterTrainingRuntime, then strategic-merges our one
``spec.runtimePatches`` entry into the runtime's JobSet template
(pkg/runtime/core/trainingruntime.go, mergeRuntimePatches), merges
``spec.trainer.resourcesPerNode`` into the container ``node``
(MergeResourceRequirements), upserts ``spec.trainer.env`` and sets its image,
command and args (pkg/runtime/framework/plugins/jobset/builder.go, Trainer;
plugins/torch/torch.go). ``trainjob_pod`` below does the same for the shape
our objects have, and the tests compare its result with the pod template of
the PyTorchJob rendered from the same spec.

Not modelled, because the controllers add it on either backend and neither
renderer emits it: the torch plugin's ``PET_*`` variables and its port 29500,
JobSet's and the Job controller's labels, hostname and subdomain; the training
operator's own variables and labels on the PyTorchJob side.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fsdp_api import FSDPTraining
from fsdp_api.contract import (
    CLUSTER_TRAINING_RUNTIME_KIND,
    JOB_COMPLETION_INDEX_ENV,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    RDZV_PORT,
    TRAINER_GROUP,
    TRAINJOB_API_VERSION,
    TRAINJOB_NODE,
    TRAINJOB_PATCH_MANAGER,
    TRAINJOB_RUNTIME,
)
from fsdp_api.launch import HOST_RENDEZVOUS_FLAG
from fsdp_operator.render import cluster_training_runtime, render

Obj = dict[str, Any]

NAME = "llama"
BASE: Obj = {
    "apiVersion": "training.fsdp.dev/v1alpha1",
    "kind": "FSDPTraining",
    "metadata": {"name": NAME, "namespace": "team-a", "uid": "0b6c5a8e-2f0e-4c52-9d0b-6f1f3c1d9a11"},
    "spec": {
        "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
        "model": {"preset": "llama3.2-1b"},
        "training": {"maxSteps": 1000, "seqLen": 2048},
        "resources": {"nodes": 2, "gpusPerNode": 8},
    },
}

# --- a strategic merge patch, for the shape of our runtime and patch ---------------------------

# patchMergeKey of the lists that have one (k8s.io/api core/v1 types.go; JobSetSpec.replicatedJobs in
# sigs.k8s.io/jobset v0.12.0 api/jobset/v1alpha2/jobset_types.go). Every other list is replaced.
MERGE_KEYS = {
    "replicatedJobs": "name",
    "containers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
}
# core/v1 PodSpec.Volumes is patchStrategy "merge,retainKeys": a patched volume keeps only the patch's source.
RETAIN_KEYS = {"volumes"}


def _merge_list(field: str, base: list[Any], patch: list[Any]) -> list[Any]:
    key = MERGE_KEYS.get(field)
    if key is None:
        return copy.deepcopy(patch)
    in_patch = {item[key] for item in patch}
    merged_patch = []
    for item in patch:
        old = next((b for b in base if b[key] == item[key]), None)
        if old is None:
            merged_patch.append(copy.deepcopy(item))
        elif field in RETAIN_KEYS:
            merged_patch.append(strategic_merge({k: v for k, v in old.items() if k in item}, item))
        else:
            merged_patch.append(strategic_merge(old, item))
    server_only = [copy.deepcopy(b) for b in base if b[key] not in in_patch]
    # apimachinery's normalizeElementOrder: the patch's items in the patch's order, the
    # base's others where they were (before the first patch item that followed them).
    order = [b[key] for b in base]
    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(merged_patch):
        if j >= len(merged_patch):
            out.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            out.append(merged_patch[j])
            j += 1
        else:
            pj = merged_patch[j][key]
            if pj in order and order.index(server_only[i][key]) < order.index(pj):
                out.append(server_only[i])
                i += 1
            else:
                out.append(merged_patch[j])
                j += 1
    return out


def strategic_merge(base: Obj, patch: Obj) -> Obj:
    out = copy.deepcopy(base)
    for field, value in patch.items():
        old = out.get(field)
        if isinstance(value, dict) and isinstance(old, dict):
            out[field] = strategic_merge(old, value)
        elif isinstance(value, list) and isinstance(old, list):
            out[field] = _merge_list(field, old, value)
        else:
            out[field] = copy.deepcopy(value)
    return out


def test_the_strategic_merge_merges_keyed_lists_and_maps_and_replaces_the_rest() -> None:
    """The helper itself, on the cases the comparison below relies on."""
    base = {
        "nodeSelector": {"a": "1"},
        "tolerations": [{"key": "x"}],
        "volumes": [{"name": "old", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        "containers": [{"name": "node", "image": "i", "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
    }
    patch = {
        "nodeSelector": {"b": "2"},
        "tolerations": [{"key": "y"}],
        "volumes": [{"name": "new", "emptyDir": {}}, {"name": "tmp", "configMap": {"name": "c"}}],
        "containers": [{"name": "node", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
    }
    merged = strategic_merge(base, patch)
    assert merged["nodeSelector"] == {"a": "1", "b": "2"}
    assert merged["tolerations"] == [{"key": "y"}]
    # tmp keeps only the patch's source (retainKeys); "old" (only in the base) stays before tmp,
    # and "new" (only in the patch, first there) comes first.
    assert merged["volumes"] == [
        {"name": "new", "emptyDir": {}},
        {"name": "old", "emptyDir": {}},
        {"name": "tmp", "configMap": {"name": "c"}},
    ]
    (node,) = merged["containers"]
    assert node["image"] == "i"
    assert [m["mountPath"] for m in node["volumeMounts"]] == ["/data", "/tmp"]


# --- what Trainer v2 makes of runtime + TrainJob ------------------------------------------------


def training(**spec: Any) -> FSDPTraining:
    body = copy.deepcopy(BASE)
    body["spec"].update(spec)
    return FSDPTraining.model_validate(body)


def job_of(backend: str, **spec: Any) -> Obj:
    kind = "TrainJob" if backend == "trainjob" else "PyTorchJob"
    return next(o for o in render(training(backend=backend, **spec)) if o["kind"] == kind)


def trainjob_pod(runtime: Obj, trainjob: Obj) -> tuple[Obj, Obj]:
    """(pod template, Job spec) of the trainer nodes: the runtime, patched and filled from spec.trainer."""
    template = runtime["spec"]["template"]
    for patch in trainjob["spec"].get("runtimePatches") or []:
        template = strategic_merge(template, patch["trainingRuntimeSpec"]["template"])
    (rjob,) = [r for r in template["spec"]["replicatedJobs"] if r["name"] == TRAINJOB_NODE]
    job_spec = copy.deepcopy(rjob["template"]["spec"])
    pod = job_spec.pop("template")
    trainer = trainjob["spec"]["trainer"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == TRAINJOB_NODE]
    for field in ("image", "command", "args"):
        if field in trainer:
            container[field] = copy.deepcopy(trainer[field])
    if "resourcesPerNode" in trainer:
        container["resources"] = strategic_merge(container.get("resources") or {}, trainer["resourcesPerNode"])
    if "env" in trainer:
        container["env"] = _merge_list("env", container.get("env") or [], trainer["env"])
    job_spec["parallelism"] = job_spec["completions"] = trainer["numNodes"]
    return pod, job_spec


def pytorchjob_pod(job: Obj) -> Obj:
    """The Worker pod template, with the replica's restartPolicy where a pod has it."""
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = copy.deepcopy(worker["template"])
    pod["spec"]["restartPolicy"] = worker["restartPolicy"]
    return pod


def string_quantities(pod: Obj) -> Obj:
    """The pod with its container's quantities as strings: 8 and "8" are one resource.Quantity to the API server.

    The TrainJob carries them as strings, the form Trainer's webhook stores them in
    (backends/trainjob.py, canonical_quantities); the PyTorchJob's GPU and EFA counts are integers.
    """
    pod = copy.deepcopy(pod)
    for container in pod["spec"]["containers"]:
        resources = container.get("resources") or {}
        container["resources"] = {kind: {k: str(q) for k, q in v.items()} for kind, v in resources.items()}
    return pod


def documented_differences(pod: Obj, spec: Obj) -> Obj:
    """A TrainJob's pod with the differences docs/backends.md lists put back to the PyTorchJob's values."""
    pod = copy.deepcopy(pod)
    (container,) = pod["spec"]["containers"]
    # Each controller requires its own container name.
    assert container["name"] == TRAINJOB_NODE
    container["name"] = "pytorch"
    # The rendezvous host: JobSet's <name>-node-0-0.<name>, not the PyTorchJob's Service <name>-worker-0.
    endpoint = f"--rdzv-endpoint={NAME}-node-0-0.{NAME}:{RDZV_PORT}"
    assert endpoint in container["args"]
    container["args"] = [
        f"--rdzv-endpoint={NAME}-worker-0:{RDZV_PORT}" if a == endpoint else a for a in container["args"]
    ]
    # Node 0 hosts the rendezvous at its own address (the built-in trainer's check does it; a
    # script of your own runs under torchrun directly): a PyTorchJob's node 0 finds its name in /etc/hosts.
    if spec.get("command") is None:
        host_if = container["args"].index(HOST_RENDEZVOUS_FLAG)
        assert container["args"][host_if + 1] == f"{JOB_COMPLETION_INDEX_ENV}=0"
        del container["args"][host_if : host_if + 2]
    else:
        assert HOST_RENDEZVOUS_FLAG not in container["args"]
    # The runtime names the c10d port for what it is; the training operator requires "pytorchjob-port".
    for port in container["ports"]:
        if port["name"] == "c10d":
            port["name"] = "pytorchjob-port"
    if not (spec.get("metrics") or {}).get("enabled", True):
        # The runtime, shared by every job, declares the metrics port even when a job serves none.
        container["ports"] = [p for p in container["ports"] if p["name"] != "metrics"]
    return pod


SPECS: dict[str, Obj] = {
    "default": {},
    "pod-settings": {
        "serviceAccountName": "trainer-s3",
        "pod": {
            "labels": {"team": "nlp", "cost-center": "42"},
            "annotations": {"example.com/owner": "alice"},
            "nodeSelector": {"example.com/pool": "training"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "example.com/rack", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                {"name": "creds", "secret": {"secretName": "s3-creds"}},
            ],
            "volumeMounts": [
                {"name": "data", "mountPath": "/data", "readOnly": True},
                {"name": "creds", "mountPath": "/var/run/creds", "readOnly": True},
            ],
            "terminationGracePeriodSeconds": 600,
        },
        "resources": {"nodes": 2, "gpusPerNode": 8, "instanceTypes": ["p5.48xlarge"]},
    },
    "efa-gpus": {"resources": {"nodes": 4, "gpusPerNode": 8, "efaPerNode": 32, "instanceTypes": ["p5.48xlarge"]}},
    "own-command": {
        "command": ["python", "/workspace/train.py"],
        "args": ["--epochs", "3"],
        "model": None,
        "training": None,
        "env": [{"name": "WANDB_PROJECT", "value": "llama"}, {"name": "NCCL_DEBUG", "value": "INFO"}],
    },
    "checkpoint-claim": {"checkpoint": {"claimName": "llama-checkpoints", "dir": "/ckpt"}},
    "placement-none-cpu": {
        "resources": {"nodes": 3, "gpusPerNode": 0, "cpu": "4", "memory": "16Gi", "placement": "none"},
        "training": {"maxSteps": 10, "seqLen": 256, "precision": "fp32"},
        "model": {"preset": "tiny"},
    },
    "metrics-off": {"metrics": {"enabled": False}},
}


def render_both(case: str) -> tuple[Obj, Obj]:
    body = copy.deepcopy(BASE)
    for key, value in SPECS[case].items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = copy.deepcopy(value)
    jobs = {}
    for backend in ("pytorchjob", "trainjob"):
        b = copy.deepcopy(body)
        b["spec"]["backend"] = backend
        objects = render(FSDPTraining.model_validate(b))
        jobs[backend] = next(o for o in objects if o["kind"] in ("PyTorchJob", "TrainJob"))
    return jobs["pytorchjob"], jobs["trainjob"]


@pytest.mark.parametrize("case", sorted(SPECS))
def test_a_trainjob_gets_the_pytorchjobs_pods(case: str) -> None:
    pytorchjob, trainjob = render_both(case)
    pod, job_spec = trainjob_pod(cluster_training_runtime(), trainjob)
    assert string_quantities(documented_differences(pod, SPECS[case])) == string_quantities(pytorchjob_pod(pytorchjob))
    # One pod per node, as the PyTorchJob's Worker replicas.
    assert job_spec["parallelism"] == pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]


def test_the_comparison_sees_a_field_the_patch_drops() -> None:
    """The merge is not vacuous: without our runtime patch the pods lose what the patch carries."""
    pytorchjob, trainjob = render_both("pod-settings")
    trainjob["spec"]["runtimePatches"] = []
    pod, _ = trainjob_pod(cluster_training_runtime(), trainjob)
    expected = pytorchjob_pod(pytorchjob)
    assert documented_differences(pod, {}) != expected
    for field in ("nodeSelector", "tolerations", "affinity", "serviceAccountName"):
        assert field not in pod["spec"], field
        assert field in expected["spec"], field


def test_the_rendezvous_host_is_node_0s_jobset_name() -> None:
    """<trainjob>-<replicated job>-<job index>-<pod index>.<subdomain>: Trainer's own PET_MASTER_ADDR (torch.go)."""
    (trainjob,) = [o for o in render(training(backend="trainjob")) if o["kind"] == "TrainJob"]
    args = trainjob["spec"]["trainer"]["args"]
    assert f"--rdzv-endpoint={NAME}-{TRAINJOB_NODE}-0-0.{NAME}:{RDZV_PORT}" in args
    assert not any(a.startswith("--rdzv-endpoint") and "worker" in a for a in args)


# --- the TrainJob's own fields -------------------------------------------------------------------


def test_the_trainjob_references_the_bundles_runtime() -> None:
    job = job_of("trainjob")
    assert job["apiVersion"] == TRAINJOB_API_VERSION
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": TRAINER_GROUP,
        "kind": CLUSTER_TRAINING_RUNTIME_KIND,
        "name": TRAINJOB_RUNTIME,
    }
    assert cluster_training_runtime()["metadata"]["name"] == TRAINJOB_RUNTIME


def test_one_runtime_patch_of_ours_on_the_runtimes_trainer_job_and_container() -> None:
    """What Trainer's validating webhook checks (plugins/jobset/jobset.go Validate): the replicated job and the
    container must exist in the runtime, the manager must be a domain-prefixed path, and no env for "node"."""
    (patch,) = job_of("trainjob")["spec"]["runtimePatches"]
    assert patch["manager"] == TRAINJOB_PATCH_MANAGER
    domain, _, path = patch["manager"].partition("/")
    assert "." in domain and path
    runtime_jobs = {r["name"]: r for r in cluster_training_runtime()["spec"]["template"]["spec"]["replicatedJobs"]}
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] in runtime_jobs
    runtime_containers = {
        c["name"] for c in runtime_jobs[rjob["name"]]["template"]["spec"]["template"]["spec"]["containers"]
    }
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] in runtime_containers
    assert "env" not in container
    # Only what a PodSpecPatch / ContainerPatch has (pkg/apis/trainer/v1alpha1/trainjob_types.go).
    pod_patch = rjob["template"]["spec"]["template"]["spec"]
    assert set(pod_patch) <= {
        "serviceAccountName",
        "volumes",
        "initContainers",
        "containers",
        "imagePullSecrets",
        "securityContext",
        "nodeSelector",
        "affinity",
        "tolerations",
        "schedulingGates",
        "terminationGracePeriodSeconds",
    }
    assert set(container) <= {"name", "env", "volumeMounts", "securityContext"}
    assert set(rjob["template"]["spec"]["template"]["metadata"]) <= {"labels", "annotations"}


def test_nodes_and_processes_per_node_are_explicit() -> None:
    gpu = job_of("trainjob", resources={"nodes": 3, "gpusPerNode": 4})["spec"]["trainer"]
    assert (gpu["numNodes"], gpu["numProcPerNode"]) == (3, 4)
    # A CPU node: one process, not Trainer's "auto" (one per CPU of the request).
    cpu = job_of("trainjob", resources={"nodes": 2, "gpusPerNode": 0, "cpu": "8", "memory": "16Gi"})["spec"]
    assert (cpu["trainer"]["numNodes"], cpu["trainer"]["numProcPerNode"]) == (2, 1)
    assert cpu["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "8"


@pytest.mark.parametrize("suspend", [True, False])
def test_suspend_is_rendered_when_not_queued(suspend: bool) -> None:
    job = job_of("trainjob", suspend=suspend)
    assert job["spec"]["suspend"] is suspend
    assert KUEUE_QUEUE_LABEL not in job["metadata"]["labels"]


@pytest.mark.parametrize("suspend", [True, False])
def test_a_queued_trainjob_leaves_suspend_to_kueue_and_carries_its_labels(suspend: bool) -> None:
    job = job_of("trainjob", suspend=suspend, scheduling={"queue": "team-a", "priorityClass": "research"})
    assert "suspend" not in job["spec"]
    assert job["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert job["metadata"]["labels"][KUEUE_PRIORITY_LABEL] == "research"
    # The same as the PyTorchJob's, where Kueue reads them from too.
    pytorchjob = job_of("pytorchjob", suspend=suspend, scheduling={"queue": "team-a", "priorityClass": "research"})
    assert job["metadata"]["labels"] == pytorchjob["metadata"]["labels"]
    assert "suspend" not in pytorchjob["spec"]["runPolicy"]


def test_active_deadline_seconds_only_when_set() -> None:
    assert "activeDeadlineSeconds" not in job_of("trainjob")["spec"]
    job = job_of("trainjob", runPolicy={"activeDeadlineSeconds": 86400})
    assert job["spec"]["activeDeadlineSeconds"] == 86400
    assert (
        job_of("pytorchjob", runPolicy={"activeDeadlineSeconds": 86400})["spec"]["runPolicy"]["activeDeadlineSeconds"]
        == 86400
    )


def test_the_job_metadata_is_the_pytorchjobs() -> None:
    """Name, labels (the operator's job label) and annotations (the checkpoints') do not depend on the backend."""
    spec = {"pod": {"labels": {"team": "nlp"}, "annotations": {"example.com/owner": "alice"}}}
    tj, pj = job_of("trainjob", **spec), job_of("pytorchjob", **spec)
    assert {k: tj["metadata"][k] for k in ("name", "namespace", "labels", "annotations")} == {
        k: pj["metadata"][k] for k in ("name", "namespace", "labels", "annotations")
    }
