"""The torch device mesh of the API's parallel plan.

``fsdp_api.parallel_plan.ParallelPlan`` decides the layout (dimension names
and sizes, shard groups, the data-parallel coordinates) without torch; this
module only turns it into a ``DeviceMesh``. ``ParallelPlan`` is re-exported so
that the trainer's modules name one place for everything parallel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.distributed as dist
from fsdp_api.parallel_plan import EFSDP, EP, REPLICATE, TP, ParallelPlan
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .distributed import WorldInfo

__all__ = [
    "ExpertMesh",
    "ParallelPlan",
    "build_expert_mesh",
    "build_mesh",
    "context_group",
    "data_parallel_mesh",
    "tensor_parallel_mesh",
]

log = logging.getLogger(__name__)


def build_mesh(world: WorldInfo, plan: ParallelPlan) -> DeviceMesh:
    """The device mesh the plan describes, over every rank (collective)."""
    mesh = init_device_mesh(world.device.type, plan.mesh_shape, mesh_dim_names=plan.mesh_dim_names)
    log.info("device mesh %s over %d ranks (%s)", plan.describe(), world.world_size, plan.strategy)
    return mesh


# transformers' token dispatch asks for the ranks that share one batch (its TP group): here each rank alone.
SHARED_BATCH = "ep_shared_batch"


@dataclass(frozen=True)
class ExpertMesh:
    """The experts' view of the FSDP ranks (``ParallelPlan.expert_mesh_shape``), one mesh and its slices."""

    mesh: DeviceMesh

    @property
    def ep(self) -> DeviceMesh:
        """The ranks one layer's experts are split over."""
        return self.mesh[EP]

    @property
    def shared_batch(self) -> DeviceMesh:
        return self.mesh[SHARED_BATCH]

    @property
    def shards_experts(self) -> bool:
        """Whether FSDP splits each expert (``efsdp > 1``), not only replicates it across hybrid groups."""
        return self.mesh[EFSDP].size() > 1

    @property
    def fsdp(self) -> DeviceMesh:
        """What FSDP shards (and, under hybrid, replicates) each expert over."""
        names = self.mesh.mesh_dim_names or ()
        return self.mesh[tuple(n for n in (REPLICATE, EFSDP) if n in names)]


def build_expert_mesh(world: WorldInfo, plan: ParallelPlan) -> ExpertMesh | None:
    """The experts' mesh over every rank (collective), or None without expert parallelism."""
    if plan.ep == 1:
        return None
    mesh = init_device_mesh(
        world.device.type,
        (*plan.expert_mesh_shape, 1),
        mesh_dim_names=(*plan.expert_mesh_dim_names, SHARED_BATCH),
    )
    names = plan.expert_mesh_dim_names
    log.info("experts' mesh %s", dict(zip(names, plan.expert_mesh_shape, strict=True)))
    return ExpertMesh(mesh)


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
