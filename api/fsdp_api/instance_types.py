"""EC2 GPU instance types: their GPUs, and the host's vCPUs, memory and pod count.

``INSTANCE_TYPES`` (GPUs, and how much memory each has) is used by the memory
plan (``fsdp_api.memory_plan``) to say whether a training fits the GPUs of
``resources.instanceTypes``. ``HOST_RESOURCES`` (vCPUs, host memory, pods per
node) gives the default CPU and memory requests of the trainer pod
(``fsdp_api.pod_resources``). Only numbers checked against AWS's own public
pages are listed; a type whose numbers could not be checked is left out (the
plan then says it does not know the type, and the pod gets no default
requests) rather than guessed. Left out for that reason: p4de, g6e, p6-b200,
and g6 sizes above 16xlarge. GPU memory is per GPU, in GiB, as AWS states it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

GIB = 1 << 30

# AWS Batch user guide, "Run GPU jobs": table of GPU instance types with
# GPUs and total GPU memory (GiB) per instance.
BATCH_GPU_JOBS = "https://docs.aws.amazon.com/batch/latest/userguide/gpu-jobs.html"
# EC2 user guide, accelerated computing instances: "G5 instances use NVIDIA A10G GPUs".
EC2_ACCELERATED = "https://docs.aws.amazon.com/AWSEC2/latest/WindowsGuide/accelerated-computing-instances.html"
# AWS compute blog, "Amazon EC2 P4d instances deep dive": "8 x 40 GB NVIDIA Tesla A100 GPUs".
P4D_BLOG = "https://aws.amazon.com/blogs/compute/amazon-ec2-p4d-instances-deep-dive/"
# SageMaker HyperPod developer guide, GPU partitions: ml.p5.48xlarge "8 NVIDIA H100
# GPUs (80GB HBM3 per GPU)", ml.p5e.48xlarge and ml.p5en.48xlarge "8 NVIDIA H200 GPUs
# (141GB HBM3e per GPU)"; the ml. types run on the EC2 types of the same name.
HYPERPOD_GPU_PARTITIONS = "https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-eks-gpu-partitioning.html"


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: int  # per GPU
    source: str

    @property
    def gpu_memory_bytes(self) -> int:
        return self.gpu_memory_gib * GIB


def _family(names: dict[str, int], gpu_model: str, memory_gib: int, source: str) -> dict[str, InstanceType]:
    return {name: InstanceType(name, gpus, gpu_model, memory_gib, source) for name, gpus in names.items()}


INSTANCE_TYPES: dict[str, InstanceType] = {
    **_family({"p5.48xlarge": 8}, "NVIDIA H100", 80, HYPERPOD_GPU_PARTITIONS),
    **_family({"p5e.48xlarge": 8, "p5en.48xlarge": 8}, "NVIDIA H200", 141, HYPERPOD_GPU_PARTITIONS),
    **_family({"p4d.24xlarge": 8}, "NVIDIA A100", 40, P4D_BLOG),
    # g5: counts and memory from the Batch table (24 GiB per GPU), the model from the EC2 guide.
    **_family(
        {
            "g5.xlarge": 1,
            "g5.2xlarge": 1,
            "g5.4xlarge": 1,
            "g5.8xlarge": 1,
            "g5.16xlarge": 1,
            "g5.12xlarge": 4,
            "g5.24xlarge": 4,
            "g5.48xlarge": 8,
        },
        "NVIDIA A10G",
        24,
        f"{BATCH_GPU_JOBS} ; {EC2_ACCELERATED}",
    ),
    # g6: the Batch table gives 1 GPU of 24 GiB for these sizes but names no GPU model.
    **_family(
        {"g6.xlarge": 1, "g6.2xlarge": 1, "g6.4xlarge": 1, "g6.8xlarge": 1, "g6.16xlarge": 1},
        "GPU (model not in the cited table)",
        24,
        BATCH_GPU_JOBS,
    ),
}


def lookup(name: str) -> InstanceType | None:
    return INSTANCE_TYPES.get(name)


# float8 matmuls (torch._scaled_mm, which torchao's float8 training calls) need CUDA compute
# capability 8.9 or later (torchao/utils.py ``is_sm_at_least_89``, torchao 0.18.0): Hopper
# (H100, H200, capability 9.0) has float8 tensor cores; Ampere (A100 8.0, A10G 8.6) has none.
# g6's GPU is not named in the table above, so it is not listed either.
FLOAT8_GPU_MODELS = ("NVIDIA H100", "NVIDIA H200")
FLOAT8_INSTANCE_TYPES = tuple(name for name, t in INSTANCE_TYPES.items() if t.gpu_model in FLOAT8_GPU_MODELS)


# --- the host: vCPUs, memory, pods ------------------------------------------------------

# EC2 User Guide, accelerated computing instances, "Hardware specifications" (Default vCPUs,
# Memory (GiB)) for g5.* and p4d.24xlarge; its source is awsdocs/amazon-ec2-user-guide
# doc_source/accelerated-computing-instances.md (commit d289961421fa79447add68ca26e3ec5ae96fdf41).
EC2_ACCELERATED_SPECS = (
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/accelerated-computing-instances.html"
    "#gpu-instance-specifications"
)
# EC2 User Guide, "IP addresses per network interface per instance type" (maximum network
# interfaces, private IPv4 addresses per interface) for g5.*: the ENI-limited pod count is
# interfaces x (addresses - 1) + 2 (source: doc_source/using-eni.md, same commit).
EC2_IP_PER_ENI = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html#AvailableIpPerENI"
# Karpenter's AWS provider reference (aws/karpenter-provider-aws,
# website/content/en/docs/reference/instance-types.md, commit
# 692ccdd0629e488300821443f0fa0bc3c3e08047), generated from EC2 DescribeInstanceTypes for the
# AL2023 AMI family: karpenter.k8s.aws/instance-cpu, instance-memory (MiB) and the pods of every
# type. The only AWS page found with the p5 family's vCPUs and memory, and with the pod counts of
# the g6, p4d and p5 types (the ENI table gives p4d's interfaces for all 4 network cards, not
# for the default card the pod count uses).
KARPENTER_INSTANCE_TYPES = "https://karpenter.sh/docs/reference/instance-types/"


@dataclass(frozen=True)
class HostResources:
    """What one node of an instance type has for pods, before Kubernetes takes its share."""

    name: str
    vcpus: int
    memory_gib: int  # host memory, as AWS states it
    max_pods: int  # the ENI-limited pod count (VPC CNI, no prefix delegation)
    source: str

    @property
    def memory_mib(self) -> int:
        return self.memory_gib * 1024


def _hosts(rows: dict[str, tuple[int, int, int]], source: str) -> dict[str, HostResources]:
    return {name: HostResources(name, cpus, mem, pods, source) for name, (cpus, mem, pods) in rows.items()}


HOST_RESOURCES: dict[str, HostResources] = {
    # (vCPUs, memory GiB, pods). g5: vCPUs and memory from the EC2 guide (the Batch table agrees),
    # pods from its ENI table (4x15 -> 58, 8x30 -> 234, 15x50 -> 737, 7x50 -> 345); Karpenter's
    # reference gives the same three numbers for every size.
    **_hosts(
        {
            "g5.xlarge": (4, 16, 58),
            "g5.2xlarge": (8, 32, 58),
            "g5.4xlarge": (16, 64, 234),
            "g5.8xlarge": (32, 128, 234),
            "g5.12xlarge": (48, 192, 737),
            "g5.16xlarge": (64, 256, 234),
            "g5.24xlarge": (96, 384, 737),
            "g5.48xlarge": (192, 768, 345),
        },
        f"{EC2_ACCELERATED_SPECS} ; {EC2_IP_PER_ENI}",
    ),
    # g6: vCPUs and memory from the Batch table, pods from Karpenter's reference.
    **_hosts(
        {
            "g6.xlarge": (4, 16, 58),
            "g6.2xlarge": (8, 32, 58),
            "g6.4xlarge": (16, 64, 234),
            "g6.8xlarge": (32, 128, 234),
            "g6.16xlarge": (64, 256, 737),
        },
        f"{BATCH_GPU_JOBS} ; {KARPENTER_INSTANCE_TYPES}",
    ),
    # p4d: vCPUs and memory from the EC2 guide, pods from Karpenter's reference.
    **_hosts({"p4d.24xlarge": (96, 1152, 737)}, f"{EC2_ACCELERATED_SPECS} ; {KARPENTER_INSTANCE_TYPES}"),
    # p5, p5e, p5en: 192 vCPUs and 2097152 MiB (2048 GiB), from Karpenter's reference only.
    **_hosts(
        {"p5.48xlarge": (192, 2048, 100), "p5e.48xlarge": (192, 2048, 100), "p5en.48xlarge": (192, 2048, 198)},
        KARPENTER_INSTANCE_TYPES,
    ),
}


# --- EFA interfaces -----------------------------------------------------------------------

# vpc.amazonaws.com/efa per instance type, as Karpenter's reference lists it (generated from
# DescribeInstanceTypes' EfaInfo.MaximumEfaInterfaces; aws/karpenter-provider-aws
# website/content/en/docs/reference/instance-types.md, commit
# 1d927085dd81a9df9301e613f371dac5b4d16bfe). A type with no such resource has no EFA (g5/g6
# below 8xlarge). Only the types of INSTANCE_TYPES are listed.
EFA_INTERFACES: dict[str, int] = {
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
    "p5en.48xlarge": 16,
    "p4d.24xlarge": 4,
    **{f"g5.{size}": 0 for size in ("xlarge", "2xlarge", "4xlarge")},
    **{f"g5.{size}": 1 for size in ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")},
    **{f"g6.{size}": 0 for size in ("xlarge", "2xlarge", "4xlarge")},
    **{f"g6.{size}": 1 for size in ("8xlarge", "16xlarge")},
}


def unknown_instance_type_notes(instance_types: list[str]) -> list[str]:
    """One line per listed type this table lacks: no GPU count, memory or EFA figure checks it.

    Only a warning: Karpenter may offer a type newer than the table, and the
    spec's rules pass a type they do not know. A near name is most likely a typo.
    """
    notes = []
    for i, name in enumerate(instance_types):
        if name in INSTANCE_TYPES:
            continue
        close = difflib.get_close_matches(name, list(INSTANCE_TYPES), n=1, cutoff=0.8)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        notes.append(
            f"spec.resources.instanceTypes[{i}]: {name!r} is not an instance type the operator knows, so its GPUs, "
            f"memory and EFA interfaces are not checked{guess}"
        )
    return notes
