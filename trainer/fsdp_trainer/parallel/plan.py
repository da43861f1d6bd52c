"""The torch device mesh of the API's parallel plan.

``fsdp_api.parallel_plan.ParallelPlan`` decides the layout (dimension names
and sizes, shard groups, the data-parallel coordinates) without torch; this
module only turns it into a ``DeviceMesh``. ``ParallelPlan`` is re-exported so
that the trainer's modules name one place for everything parallel.
"""

from __future__ import annotations

import logging

from fsdp_api.parallel_plan import TP, ParallelPlan
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .distributed import WorldInfo

__all__ = ["ParallelPlan", "build_mesh", "data_parallel_mesh", "tensor_parallel_mesh"]

log = logging.getLogger(__name__)


def build_mesh(world: WorldInfo, plan: ParallelPlan) -> DeviceMesh:
    """The device mesh the plan describes, over every rank (collective)."""
    mesh = init_device_mesh(world.device.type, plan.mesh_shape, mesh_dim_names=plan.mesh_dim_names)
    log.info("device mesh %s over %d ranks (%s)", plan.describe(), world.world_size, plan.strategy)
    return mesh


def data_parallel_mesh(mesh: DeviceMesh, plan: ParallelPlan) -> DeviceMesh:
    """The dimensions FSDP shards and replicates over (the whole mesh without model parallelism)."""
    return mesh if plan.non_dp_size == 1 else mesh[plan.dp_dim_names]


def tensor_parallel_mesh(mesh: DeviceMesh, plan: ParallelPlan) -> DeviceMesh | None:
    """The tensor-parallel peers of this rank (None without tensor parallelism)."""
    return mesh[TP] if plan.tp > 1 else None
