"""Default CPU and memory requests of the trainer pod, and the default size of its /dev/shm.

A job that names its instance types but no ``resources.cpu``/``memory`` gets
requests derived from the smallest of those types, so that its pod has a
memory request (and limit) and is not the first one evicted, and so that its
memory-backed ``/dev/shm`` has a bound. The numbers (docs/renderer.md):

- What a node offers pods is computed the way Karpenter's AWS provider
  computes it for the AL2023 AMI family, which is what Karpenter checks a pod
  against before it launches a node for it (aws/karpenter-provider-aws,
  ``pkg/providers/instancetype/types.go``: ``memory``, ``kubeReservedResources``,
  ``evictionThreshold``; ``pkg/operator/options/options.go``:
  ``VM_MEMORY_OVERHEAD_PERCENT`` defaults to 0.075; commit
  1d927085dd81a9df9301e613f371dac5b4d16bfe). It reproduces the allocatable
  CPU and memory that Karpenter's reference lists for every type of
  ``HOST_RESOURCES`` (tests/operator/render/test_render_qos.py checks them).
- From that, a fixed allowance for the node's DaemonSets (``DAEMONSET_*``).
- CPU is rounded down to whole cores, memory to whole GiB.

The API package owns these numbers; the renderer only reads
``ResourcesSpec.effective_cpu()``, ``effective_memory()`` and
``effective_shared_memory()``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from .instance_types import HOST_RESOURCES, HostResources

MIB = 1 << 20
GIB = 1 << 30

# Karpenter: the EC2 memory less a VM overhead it has not measured yet (7.5% by default),
# less kube-reserved (11 MiB per pod + 255 MiB), less the kubelet's hard eviction threshold.
VM_MEMORY_OVERHEAD = Fraction(75, 1000)
KUBE_RESERVED_MIB_PER_POD = 11
KUBE_RESERVED_MIB_BASE = 255
EVICTION_HARD_MIB = 100
# Karpenter's kube-reserved CPU (from Bottlerocket's): 6% of the first core, 1% of the second,
# 0.5% of the next two, 0.25% of every core above four. (start, end, fraction) in millicores.
KUBE_RESERVED_CPU = (
    (0, 1000, Fraction(6, 100)),
    (1000, 2000, Fraction(1, 100)),
    (2000, 4000, Fraction(5, 1000)),
    (4000, 1 << 31, Fraction(25, 10000)),
)
# Room left for the DaemonSets of a GPU node (CNI, kube-proxy, device plugins, dcgm-exporter,
# node-exporter, CSI node plugins). Their default charts request little (aws-node 25m CPU,
# kube-proxy 100m, the rest nothing), but what they use comes out of the same allocatable memory.
DAEMONSET_CPU_MILLI = 500
DAEMONSET_MEMORY_MIB = 1024
# Default /dev/shm size limit: this fraction of the pod's memory limit.
SHARED_MEMORY_FRACTION = Fraction(1, 4)


@dataclass(frozen=True)
class Allocatable:
    """What Karpenter expects a node to offer pods: CPU in millicores, memory in MiB."""

    cpu_milli: int
    memory_mib: int


def allocatable(host: HostResources) -> Allocatable:
    """Karpenter's allocatable CPU and memory of one node of ``host`` (AL2023, x86, default kubelet)."""
    cpu_milli = host.vcpus * 1000
    reserved_cpu = 0
    for start, end, fraction in KUBE_RESERVED_CPU:
        if cpu_milli >= start:
            reserved_cpu += math.floor((min(cpu_milli, end) - start) * fraction)
    memory = host.memory_mib - math.ceil(host.memory_mib * VM_MEMORY_OVERHEAD)
    kube_reserved = KUBE_RESERVED_MIB_PER_POD * host.max_pods + KUBE_RESERVED_MIB_BASE
    return Allocatable(cpu_milli - reserved_cpu, memory - kube_reserved - EVICTION_HARD_MIB)


@dataclass(frozen=True)
class DefaultRequests:
    """Per-pod requests derived from instance types: whole cores, whole GiB."""

    cpu_cores: int
    memory_gib: int

    @property
    def cpu(self) -> str:
        return str(self.cpu_cores)

    @property
    def memory(self) -> str:
        return f"{self.memory_gib}Gi"


def requests_for(host: HostResources) -> DefaultRequests:
    alloc = allocatable(host)
    return DefaultRequests(
        cpu_cores=max(1, (alloc.cpu_milli - DAEMONSET_CPU_MILLI) // 1000),
        memory_gib=max(1, (alloc.memory_mib - DAEMONSET_MEMORY_MIB) // 1024),
    )


def default_requests(instance_types: list[str]) -> DefaultRequests | None:
    """The requests that fit every listed type (the smallest of each), or None.

    None when no type is listed or when one of them has no verified numbers
    (``HOST_RESOURCES``): the smallest would then be unknown.
    """
    if not instance_types or any(name not in HOST_RESOURCES for name in instance_types):
        return None
    each = [requests_for(HOST_RESOURCES[name]) for name in instance_types]
    return DefaultRequests(min(r.cpu_cores for r in each), min(r.memory_gib for r in each))


# --- quantities --------------------------------------------------------------------------

_SUFFIXES: dict[str, Fraction] = {
    "Ki": Fraction(1 << 10),
    "Mi": Fraction(1 << 20),
    "Gi": Fraction(1 << 30),
    "Ti": Fraction(1 << 40),
    "Pi": Fraction(1 << 50),
    "Ei": Fraction(1 << 60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?$"
)


def parse_quantity(value: int | str) -> Fraction:
    """A Kubernetes quantity (``64Gi``, ``1800G``, ``500m``, ``1e9``, 17) as an exact number."""
    if isinstance(value, int):
        return Fraction(value)
    m = _QUANTITY.match(value)
    if m is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number = Fraction(m["number"])
    if m["sign"] == "-":
        number = -number
    if m["exponent"] is not None:
        return number * Fraction(10) ** int(m["exponent"])
    return number * _SUFFIXES[m["suffix"] or ""]


def format_bytes(n: int) -> str:
    """Whole GiB when at least one, else whole MiB (rounded down)."""
    return f"{n // GIB}Gi" if n >= GIB else f"{n // MIB}Mi"


def default_shared_memory(memory_limit: int | str) -> str | None:
    """A quarter of the memory limit, rounded down; None when that is less than 1 MiB."""
    size = math.floor(parse_quantity(memory_limit) * SHARED_MEMORY_FRACTION)
    return format_bytes(size) if size >= MIB else None


def default_memory_bytes() -> dict[str, int]:
    """Instance type -> its default memory request in bytes, for the API server's rule on sharedMemory."""
    return {name: requests_for(host).memory_gib * GIB for name, host in sorted(HOST_RESOURCES.items())}
