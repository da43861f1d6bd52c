"""The parallelism section: degrees of model parallelism beside FSDP's data parallelism."""

from __future__ import annotations

from pydantic import Field

from ..base import ApiModel

# The most GPUs one node of any supported instance type holds (p5, p4d: 8).
MAX_TENSOR = 8


class ParallelismSpec(ApiModel):
    """How each layer's work is split beside FSDP's data parallelism (docs/parallelism.md)."""

    tensor: int = Field(
        1,
        ge=1,
        le=MAX_TENSOR,
        description=(
            "Tensor-parallel degree: each decoder block's attention and MLP projections are split over this "
            "many GPUs of one node, with the model's own transformers tensor-parallel plan (base_model_tp_plan); "
            "FSDP shards over the rest (data-parallel size = nodes x gpusPerNode / tensor). It must divide "
            "resources.gpusPerNode and the model's attention heads, key-value heads and MLP width. "
            "1: data parallelism only."
        ),
    )
