"""QoS of the trainer pod: CPU/memory requests derived from the instance types, and /dev/shm's bound.

A spec without ``resources.cpu``/``memory`` used to render a pod with only
GPU/EFA requests: BestEffort for Kubernetes (no CPU or memory request), the
first pod evicted under memory pressure, with an unbounded memory-backed
/dev/shm. The numbers come from ``fsdp_api.pod_resources`` (docs/renderer.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_api import FSDPTraining
from fsdp_api.instance_types import HOST_RESOURCES
from fsdp_api.pod_resources import allocatable, default_requests, parse_quantity
from fsdp_operator.render import render
from pydantic import ValidationError

Obj = dict[str, Any]

CRD_FILE = Path(__file__).resolve().parents[3] / "kustomize" / "crd" / "training.fsdp.dev_fsdptrainings.yaml"


def body(**resources: Any) -> Obj:
    return {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": "llama", "namespace": "default"},
        "spec": {
            "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
            "model": {"preset": "llama3.2-1b"},
            "training": {"maxSteps": 1000},
            "resources": resources,
        },
    }


def job(**resources: Any) -> Obj:
    (pytorchjob,) = [o for o in render(FSDPTraining.model_validate(body(**resources))) if o["kind"] == "PyTorchJob"]
    return pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def container_resources(pod: Obj) -> Obj:
    (c,) = pod["containers"]
    return c["resources"]


def shm(pod: Obj) -> Obj:
    (c,) = pod["containers"]
    (name,) = [m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == name]
    return vol["emptyDir"]


def qos_class(pod: Obj) -> str:
    """The pod's QoS class as the kubelet computes it (only cpu and memory count)."""
    requests: dict[str, list[Any]] = {"cpu": [], "memory": []}
    limits: dict[str, list[Any]] = {"cpu": [], "memory": []}
    guaranteed = True
    for c in pod["containers"]:
        res = c.get("resources", {})
        req = {k: v for k, v in res.get("requests", {}).items() if k in requests}
        lim = {k: v for k, v in res.get("limits", {}).items() if k in limits}
        for k, v in req.items():
            requests[k].append(v)
        for k, v in lim.items():
            limits[k].append(v)
        # A limit without a request defaults the request to it.
        effective = {**lim, **req}
        if set(lim) != {"cpu", "memory"} or any(parse_quantity(effective[k]) != parse_quantity(lim[k]) for k in lim):
            guaranteed = False
    if not any(requests.values()) and not any(limits.values()):
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# Karpenter's reference (https://karpenter.sh/docs/reference/instance-types/, generated from EC2
# DescribeInstanceTypes, AMI family AL2023): the allocatable cpu and memory it lists per type.
KARPENTER_ALLOCATABLE = {
    "g5.xlarge": ("3920m", "14162Mi"),
    "g5.2xlarge": ("7910m", "29317Mi"),
    "g5.4xlarge": ("15890m", "57691Mi"),
    "g5.8xlarge": ("31850m", "118312Mi"),
    "g5.12xlarge": ("47810m", "173400Mi"),
    "g5.16xlarge": ("63770m", "239554Mi"),
    "g5.24xlarge": ("95690m", "355262Mi"),
    "g5.48xlarge": ("191450m", "723299Mi"),
    "g6.xlarge": ("3920m", "14162Mi"),
    "g6.2xlarge": ("7910m", "29317Mi"),
    "g6.4xlarge": ("15890m", "57691Mi"),
    "g6.8xlarge": ("31850m", "118312Mi"),
    "g6.16xlarge": ("63770m", "234021Mi"),
    "p4d.24xlarge": ("95690m", "1082712Mi"),
    "p5.48xlarge": ("191450m", "1938410Mi"),
    "p5e.48xlarge": ("191450m", "1938410Mi"),
    "p5en.48xlarge": ("191450m", "1937332Mi"),
}


def test_the_formula_reproduces_karpenters_allocatable_for_every_type() -> None:
    assert set(KARPENTER_ALLOCATABLE) == set(HOST_RESOURCES)
    for name, (cpu, memory) in KARPENTER_ALLOCATABLE.items():
        alloc = allocatable(HOST_RESOURCES[name])
        assert (f"{alloc.cpu_milli}m", f"{alloc.memory_mib}Mi") == (cpu, memory), name


def test_every_default_fits_what_karpenter_offers_with_room_for_daemonsets() -> None:
    for name, (cpu, memory) in KARPENTER_ALLOCATABLE.items():
        d = default_requests([name])
        assert d is not None
        assert parse_quantity(cpu) - parse_quantity(d.cpu) >= parse_quantity("500m"), name
        assert parse_quantity(memory) - parse_quantity(d.memory) >= parse_quantity("1Gi"), name


@pytest.mark.parametrize(
    ("instance_type", "gpus", "cpu", "memory", "shm_size"),
    [
        # 48 vCPUs, 192 GiB, 737 pods: 47810m, 173400Mi allocatable; less 500m, 1Gi.
        ("g5.12xlarge", 4, "47", "168Gi", "42Gi"),
        # 192 vCPUs, 2048 GiB, 100 pods: 191450m, 1938410Mi allocatable.
        ("p5.48xlarge", 8, "190", "1891Gi", "472Gi"),
        ("g5.xlarge", 1, "3", "12Gi", "3Gi"),
    ],
)
def test_requests_default_from_the_instance_type(
    instance_type: str, gpus: int, cpu: str, memory: str, shm_size: str
) -> None:
    pod = job(gpusPerNode=gpus, instanceTypes=[instance_type])
    res = container_resources(pod)
    assert res["requests"] == {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}
    # Memory: request == limit; CPU: request only (no CFS throttling).
    assert res["limits"] == {"memory": memory, "nvidia.com/gpu": gpus}
    assert qos_class(pod) == "Burstable"
    assert shm(pod) == {"medium": "Memory", "sizeLimit": shm_size}


def test_without_the_default_the_same_pod_is_best_effort() -> None:
    # An instance type with no verified size keeps today's rendering: GPU requests only.
    pod = job(gpusPerNode=8, instanceTypes=["p6-b200.48xlarge"])
    assert container_resources(pod) == {"requests": {"nvidia.com/gpu": 8}, "limits": {"nvidia.com/gpu": 8}}
    assert qos_class(pod) == "BestEffort"
    assert shm(pod) == {"medium": "Memory"}


def test_explicit_cpu_and_memory_win() -> None:
    pod = job(gpusPerNode=8, instanceTypes=["p5.48xlarge"], cpu=90, memory="1800Gi")
    res = container_resources(pod)
    assert res["requests"] == {"cpu": "90", "memory": "1800Gi", "nvidia.com/gpu": 8}
    assert res["limits"] == {"memory": "1800Gi", "nvidia.com/gpu": 8}
    assert shm(pod) == {"medium": "Memory", "sizeLimit": "450Gi"}


def test_each_of_cpu_and_memory_defaults_on_its_own() -> None:
    only_cpu = container_resources(job(gpusPerNode=4, instanceTypes=["g5.12xlarge"], cpu="40"))
    assert only_cpu["requests"]["cpu"] == "40"
    assert only_cpu["requests"]["memory"] == only_cpu["limits"]["memory"] == "168Gi"
    only_memory = container_resources(job(gpusPerNode=4, instanceTypes=["g5.12xlarge"], memory="100Gi"))
    assert only_memory["requests"]["cpu"] == "47"
    assert only_memory["requests"]["memory"] == only_memory["limits"]["memory"] == "100Gi"


def test_several_instance_types_take_the_smallest() -> None:
    # g5.48xlarge has more of both; g5.12xlarge bounds cpu and memory.
    res = container_resources(job(gpusPerNode=4, instanceTypes=["g5.48xlarge", "g5.12xlarge"]))
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("47", "168Gi")
    # The smallest of each, not one type's pair: p5en has less memory, p4d fewer cores.
    res = container_resources(job(gpusPerNode=8, instanceTypes=["p5en.48xlarge", "p4d.24xlarge", "p5.48xlarge"]))
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("95", "1056Gi")
    res = container_resources(job(gpusPerNode=8, instanceTypes=["p5.48xlarge", "p5en.48xlarge"]))
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("190", "1890Gi")


def test_an_unknown_type_among_several_means_no_default() -> None:
    # The smallest is unknown, so nothing is guessed.
    res = container_resources(job(gpusPerNode=8, instanceTypes=["p5.48xlarge", "p6-b200.48xlarge"]))
    assert "cpu" not in res["requests"] and "memory" not in res["requests"]
    assert "memory" not in res["limits"]


def test_no_instance_types_no_default() -> None:
    pod = job(gpusPerNode=8)
    assert container_resources(pod) == {"requests": {"nvidia.com/gpu": 8}, "limits": {"nvidia.com/gpu": 8}}
    assert shm(pod) == {"medium": "Memory"}


def test_cpu_jobs_render_as_before() -> None:
    pod = job(gpusPerNode=0, nodePool="cpu", instanceTypes=["m7i.8xlarge"])
    assert container_resources(pod) == {}
    assert shm(pod) == {"medium": "Memory"}
    pod = job(gpusPerNode=0, nodePool="cpu", cpu="30", memory="100Gi")
    assert container_resources(pod) == {"requests": {"cpu": "30", "memory": "100Gi"}, "limits": {"memory": "100Gi"}}
    assert shm(pod) == {"medium": "Memory", "sizeLimit": "25Gi"}


def test_shm_defaults_to_a_quarter_of_the_memory_limit_and_the_explicit_one_wins() -> None:
    assert shm(job(gpusPerNode=8, memory="64Gi")) == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert shm(job(gpusPerNode=8, memory="1G")) == {"medium": "Memory", "sizeLimit": "238Mi"}
    explicit = job(gpusPerNode=4, instanceTypes=["g5.12xlarge"], sharedMemory="8Gi")
    assert shm(explicit) == {"medium": "Memory", "sizeLimit": "8Gi"}
    # Without any memory limit the explicit one is kept as it is.
    assert shm(job(gpusPerNode=8, sharedMemory="64Gi")) == {"medium": "Memory", "sizeLimit": "64Gi"}
    # Equal to the limit is allowed.
    assert shm(job(gpusPerNode=8, memory="64Gi", sharedMemory="64Gi"))["sizeLimit"] == "64Gi"


SHM_REFUSED = [
    {"memory": "16Gi", "sharedMemory": "32Gi"},
    {"memory": "16Gi", "sharedMemory": 17 * 2**30},
    {"memory": 2**30, "sharedMemory": "1025Mi"},
    # g5.xlarge's derived limit is 12Gi; g5.xlarge is the smallest of the two.
    {"gpusPerNode": 1, "instanceTypes": ["g5.xlarge"], "sharedMemory": "13Gi"},
    {"gpusPerNode": 1, "instanceTypes": ["g5.48xlarge", "g5.xlarge"], "sharedMemory": "13Gi"},
]
SHM_ACCEPTED = [
    {"gpusPerNode": 1, "instanceTypes": ["g5.xlarge"], "sharedMemory": "12Gi"},
    # An unknown type: no derived limit to compare with.
    {"gpusPerNode": 1, "instanceTypes": ["g5.xlarge", "p6-b200.48xlarge"], "sharedMemory": "13Gi"},
    # An explicit memory replaces the derived one.
    {"gpusPerNode": 1, "instanceTypes": ["g5.xlarge"], "memory": "14Gi", "sharedMemory": "13Gi"},
    {"memory": 2**30, "sharedMemory": 2**30},
]


@pytest.mark.parametrize("resources", SHM_REFUSED)
def test_shm_above_the_memory_limit_is_refused(resources: Obj) -> None:
    with pytest.raises(ValidationError, match="sharedMemory must not exceed the memory limit"):
        job(**resources)


@pytest.mark.parametrize("resources", SHM_ACCEPTED)
def test_shm_within_the_memory_limit_is_accepted(resources: Obj) -> None:
    assert parse_quantity(shm(job(**resources))["sizeLimit"]) == parse_quantity(resources["sharedMemory"])


@pytest.mark.cluster
def test_the_api_server_draws_the_same_line(cluster: Any) -> None:
    """The CEL half of the rule (the defaults as a table) agrees with pydantic on every case."""
    cluster.install_crds(CRD_FILE)
    for resources, accepted in [(r, False) for r in SHM_REFUSED] + [(r, True) for r in SHM_ACCEPTED]:
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body(**resources)), check=False)
        assert (res.returncode == 0) == accepted, (resources, res.stderr)
        if not accepted:
            assert "spec.resources.sharedMemory" in res.stderr
            assert "sharedMemory must not exceed the memory limit" in res.stderr


@pytest.mark.parametrize(
    ("text", "value"),
    [("64Gi", 64 * 2**30), ("1800G", 1800 * 10**9), ("500m", 0.5), ("1e3", 1000), ("+.5Ki", 512), (17, 17)],
)
def test_parse_quantity(text: Any, value: float) -> None:
    assert parse_quantity(text) == value
