"""The fsdp section: how FSDP2 shards the model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel


class FSDPSpec(ApiModel):
    """How FSDP2 shards the model."""

    sharding_strategy: Literal["full", "shard_grad_op", "no_shard", "hybrid"] = Field(
        default="full",
        description=(
            "full: shard parameters, gradients and optimizer state, reshard after forward (ZeRO-3); "
            "shard_grad_op: keep parameters unsharded between forward and backward (ZeRO-2); "
            "no_shard: replicate (DDP-like); hybrid: shard within a node, replicate across nodes (needs nodes >= 2)."
        ),
    )
    cpu_offload: bool = Field(
        default=False, description="Keep sharded parameters, gradients and optimizer state in CPU memory."
    )
    prefetch: int = Field(
        default=0,
        ge=0,
        le=8,
        description="Explicit forward/backward prefetch depth in layers; 0 leaves FSDP's implicit prefetch.",
    )
    shard_group_size: int | None = Field(
        default=None,
        ge=1,
        le=16384,
        description=(
            "hybrid only: ranks per shard group (the inner dimension of the 2-D mesh); "
            "unset: the processes of one node. The world size must be a multiple of it."
        ),
    )
