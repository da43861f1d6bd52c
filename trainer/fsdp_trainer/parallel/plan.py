"""The torch device mesh of the API's parallel plan.

``fsdp_api.parallel_plan.ParallelPlan`` decides the layout (dimension names
and sizes, shard groups, the data-parallel coordinates) without torch; this
module only turns it into a ``DeviceMesh``. ``ParallelPlan`` is re-exported so
that the trainer's modules name one place for everything parallel.
"""

from __future__ import annotations

import logging

import torch.distributed as dist
from fsdp_api.parallel_plan import TP, ParallelPlan
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .distributed import WorldInfo

__all__ = ["ParallelPlan", "build_mesh", "context_group", "data_parallel_mesh", "tensor_parallel_mesh"]

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


def context_group(world: WorldInfo, plan: ParallelPlan) -> tuple[dist.ProcessGroup, int]:
    """This rank's context-parallel group and its index in it (collective: every rank makes every group).

    The context peers of a rank share its data-parallel and tensor-parallel
    coordinates: ranks ``d·cp·tp + c·tp + t`` for c in 0..cp-1.
    """
    cp, tp = plan.cp, plan.tp
    mine: dist.ProcessGroup | None = None
    for d in range(plan.dp_size):
        for t in range(tp):
            ranks = [d * cp * tp + c * tp + t for c in range(cp)]
            group = dist.new_group(ranks)
            if world.rank in ranks:
                assert isinstance(group, dist.ProcessGroup)  # a member gets the group, the others NON_GROUP_MEMBER
                mine = group
    assert mine is not None
    return mine, (world.rank // tp) % cp
