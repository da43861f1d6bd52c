"""EC2 GPU instance types: how many GPUs, which, and how much memory each has.

Used by the memory plan (``fsdp_api.memory_plan``) to say whether a training
fits the GPUs of ``resources.instanceTypes``. Only numbers checked against
AWS's own public pages are listed; a type whose numbers could not be checked
is left out (the plan then says it does not know the type) rather than
guessed. Left out for that reason: p4de, g6e, p6-b200, and g6 sizes above
16xlarge. Memory is per GPU, in GiB, as AWS states it.
"""

from __future__ import annotations

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
