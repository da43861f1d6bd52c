"""Where the job runs: nodes, GPUs, EFA, requests and Karpenter capacity; the elastic node range."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from ..base import ApiModel
from ..instance_types import EFA_INTERFACES, INSTANCE_TYPES
from ..pod_resources import (
    DefaultRequests,
    default_memory_bytes,
    default_requests,
    default_shared_memory,
    parse_quantity,
)
from ..rules import Rule
from .values import DNS_LABEL, MAX_NODES, QUANTITY_PATTERN, Quantity

# EC2 families whose instances have GPUs (p: NVIDIA training, g: NVIDIA graphics/inference).
GPU_INSTANCE_PATTERN = r"^(p|g)[0-9]"

# sharedMemory <= the memory limit: memory, else the smallest default of the listed instance
# types (when all of them have one). Quantities are compared with the API server's quantity
# library; the defaults (bytes) are a table from pod_resources, so both sides use the same
# numbers. Against the table the comparison is in float64, exact for any size up to 8 PiB:
# quantity(string(<an int the estimator cannot bound>)) exceeds the CEL cost budget.
_DEFAULT_MEMORY = "{" + ", ".join(f"'{name}': {size}" for name, size in default_memory_bytes().items()) + "}"
_SHARED_MEMORY_CEL = (
    "!has(self.sharedMemory) || !isQuantity(string(self.sharedMemory)) || ("
    "has(self.memory) ? (!isQuantity(string(self.memory)) || "
    "quantity(string(self.sharedMemory)).compareTo(quantity(string(self.memory))) <= 0) : ("
    "!has(self.instanceTypes) || self.instanceTypes.size() == 0 || "
    f"self.instanceTypes.exists(t, !(t in {_DEFAULT_MEMORY})) || "
    "quantity(string(self.sharedMemory)).asApproximateFloat() <= "
    f"double(self.instanceTypes.map(t, {_DEFAULT_MEMORY}[t]).min())))"
)

# gpusPerNode <= the most GPUs among the listed instance types, when all are known (the
# table of instance_types, checked against AWS's pages): a pod asking for more fits no
# node Karpenter could launch, and would stay Pending.
_GPUS = "{" + ", ".join(f"'{name}': {t.gpus}" for name, t in sorted(INSTANCE_TYPES.items())) + "}"
_GPUS_FIT_CEL = (
    "!has(self.instanceTypes) || self.instanceTypes.size() == 0 || "
    f"self.instanceTypes.exists(t, !(t in {_GPUS})) || "
    f"self.instanceTypes.exists(t, {_GPUS}[t] >= (has(self.gpusPerNode) ? self.gpusPerNode : 8))"
)


# efaPerNode <= the most EFA interfaces among the listed instance types, when all are known:
# the EFA device plugin advertises that many vpc.amazonaws.com/efa per node, no more.
_EFA = "{" + ", ".join(f"'{name}': {n}" for name, n in sorted(EFA_INTERFACES.items())) + "}"
_EFA_FIT_CEL = (
    "!has(self.efaPerNode) || self.efaPerNode == 0 || !has(self.instanceTypes) || "
    f"self.instanceTypes.size() == 0 || self.instanceTypes.exists(t, !(t in {_EFA})) || "
    f"self.instanceTypes.exists(t, {_EFA}[t] >= self.efaPerNode)"
)


def _most(per_type: dict[str, int], instance_types: list[str]) -> int | None:
    """The most any listed type has; None when none is listed or one is not in the table (no guess)."""
    if not instance_types or any(t not in per_type for t in instance_types):
        return None
    return max(per_type[t] for t in instance_types)


def _efa_fits(r: ResourcesSpec) -> bool:
    most = _most(EFA_INTERFACES, r.instance_types)
    return r.efa_per_node == 0 or most is None or most >= r.efa_per_node


def _gpus_fit(r: ResourcesSpec) -> bool:
    most = _most({name: t.gpus for name, t in INSTANCE_TYPES.items()}, r.instance_types)
    return most is None or most >= r.gpus_per_node


class ResourcesSpec(ApiModel):
    """Where the job runs: node count, GPUs, EFA and Karpenter capacity."""

    nodes: int = Field(default=1, ge=1, le=MAX_NODES, description="Number of nodes (pods); one pod per node.")
    gpus_per_node: int = Field(
        default=8,
        ge=0,
        le=16,
        description="GPUs per node; one training process per GPU. 0 runs one CPU process per node.",
    )
    instance_types: list[Annotated[str, Field(min_length=1, max_length=64, description="An EC2 instance type.")]] = (
        Field(
            default_factory=list,
            max_length=64,
            description="Allowed EC2 instance types (e.g. p5.48xlarge); empty: any in the NodePool.",
        )
    )
    capacity_type: Literal["on-demand", "spot", "reserved"] = Field(
        default="on-demand", description="Karpenter capacity type to run on."
    )
    node_pool: str = Field(
        default="gpu", pattern=DNS_LABEL, description="Karpenter NodePool that provisions the nodes."
    )
    placement: Literal["karpenter", "none"] = Field(
        default="karpenter",
        description=(
            "karpenter: select nodes of nodePool with capacityType (Karpenter's labels) and ask Karpenter not to "
            "disrupt them; none: no Karpenter label, selector or annotation at all (SageMaker HyperPod, managed "
            "node groups): nodePool and capacityType are ignored, pod.nodeSelector and pod.affinity choose the nodes."
        ),
    )
    efa_per_node: int = Field(
        default=0, ge=0, le=32, description="EFA interfaces (vpc.amazonaws.com/efa) per node; 0: no EFA."
    )
    cpu: Quantity | None = Field(
        default=None,
        description=(
            "CPU request per pod (e.g. 90); no limit. Unset: derived from instanceTypes, the smallest "
            "type's allocatable vCPUs as Karpenter computes them less room for DaemonSets "
            "(docs/renderer.md); no request when none is listed or one has no known size."
        ),
    )
    memory: Quantity | None = Field(
        default=None,
        description=(
            "Memory request and limit per pod (e.g. 1800Gi). Unset: derived from instanceTypes like cpu "
            "(docs/renderer.md); none when none is listed or one has no known size."
        ),
    )
    shared_memory: Quantity | None = Field(
        default=None,
        description=(
            "Size limit of the memory-backed /dev/shm, whose pages count against the memory limit "
            "(at most that limit). Unset: a quarter of the memory limit; no limit when the pod has none."
        ),
    )

    @field_validator("cpu", "memory", "shared_memory")
    @classmethod
    def _quantity(cls, v: int | str | None) -> str | None:
        if v is None:
            return None
        s = str(v)
        if s.startswith("-") and re.match(QUANTITY_PATTERN, s[1:]):
            raise ValueError(f"{s!r} is negative: requests and limits must be at least 0")
        if not re.match(QUANTITY_PATTERN, s):
            raise ValueError(f"{s!r} is not a Kubernetes quantity (e.g. 64Gi, 500m)")
        return s

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "(has(self.gpusPerNode) ? self.gpusPerNode : 8) > 0 || !has(self.instanceTypes)"
                f" || !self.instanceTypes.exists(t, t.matches('{GPU_INSTANCE_PATTERN}'))"
            ),
            message=(
                "gpusPerNode is 0 but instanceTypes lists GPU instances (p*, g*): the CPU job would hold "
                "GPU nodes it never uses; set gpusPerNode or list CPU instance types"
            ),
            field_path=".instanceTypes",
            check=lambda r: r.gpus_per_node > 0 or not any(re.match(GPU_INSTANCE_PATTERN, t) for t in r.instance_types),
        ),
        Rule(
            cel=_GPUS_FIT_CEL,
            message=(
                "gpusPerNode is more than any of instanceTypes has: no node Karpenter could launch fits the "
                "pod (p5/p5e/p5en/p4d.24xlarge have 8 GPUs; docs/eks-capacity.md)"
            ),
            field_path=".gpusPerNode",
            check=_gpus_fit,
        ),
        Rule(
            cel=_EFA_FIT_CEL,
            message=(
                "efaPerNode is more than any of instanceTypes has: no node Karpenter could launch fits the pod "
                "(p5/p5e.48xlarge have 32, p5en.48xlarge 16, p4d.24xlarge 4, g5/g6 from 8xlarge 1, smaller "
                "g5/g6 none; docs/eks-capacity.md)"
            ),
            field_path=".efaPerNode",
            check=_efa_fits,
        ),
        Rule(
            cel=_SHARED_MEMORY_CEL,
            message=(
                "sharedMemory must not exceed the memory limit (memory, or the one derived from "
                "instanceTypes): /dev/shm's pages count against it"
            ),
            field_path=".sharedMemory",
            check=lambda r: r.shared_memory_fits(),
        ),
    )

    def default_requests(self) -> DefaultRequests | None:
        """CPU and memory derived from instanceTypes (pod_resources), whether or not cpu/memory are set."""
        return default_requests(self.instance_types)

    def effective_cpu(self) -> str | None:
        """The CPU request: cpu, else derived from instanceTypes, else None."""
        if self.cpu is not None:
            return str(self.cpu)
        defaults = self.default_requests()
        return defaults.cpu if defaults else None

    def effective_memory(self) -> str | None:
        """The memory request and limit: memory, else derived from instanceTypes, else None."""
        if self.memory is not None:
            return str(self.memory)
        defaults = self.default_requests()
        return defaults.memory if defaults else None

    def effective_shared_memory(self) -> str | None:
        """/dev/shm's size limit: sharedMemory, else a quarter of the memory limit, else None."""
        if self.shared_memory is not None:
            return str(self.shared_memory)
        memory = self.effective_memory()
        return default_shared_memory(memory) if memory is not None else None

    def shared_memory_fits(self) -> bool:
        memory = self.effective_memory()
        if self.shared_memory is None or memory is None:
            return True
        return parse_quantity(self.shared_memory) <= parse_quantity(memory)


class ElasticSpec(ApiModel):
    """Elastic training: torchrun tolerates node loss between minNodes and maxNodes."""

    min_nodes: int = Field(ge=1, le=MAX_NODES, description="Fewest nodes to keep training with.")
    max_nodes: int = Field(ge=1, le=MAX_NODES, description="Most nodes to train with.")
    max_restarts: int = Field(
        default=3, ge=0, le=1000, description="Times torchrun restarts the workers before failing."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.minNodes <= self.maxNodes",
            message="minNodes must not exceed maxNodes",
            field_path=".minNodes",
            check=lambda e: e.min_nodes <= e.max_nodes,
        ),
    )
