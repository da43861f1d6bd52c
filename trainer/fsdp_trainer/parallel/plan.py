"""What ``fsdp.shardingStrategy`` means for one launch: the one place that decides it.

``ParallelPlan`` (in the spirit of torchtitan's ``ParallelDims``) is built
from the FSDP section and the launch (world size, processes per node) and
answers every question the rest of the trainer asks about data parallelism:
whether FSDP is used at all, the device mesh's shape and dimension names, the
shard-group size of ``hybrid``, ``reshard_after_forward``, and whether the
combination can be built (checked before any process group exists).

- full: 1-D mesh ``(shard=W)``, ``reshard_after_forward=True``: parameters
  are freed after each layer's forward and re-gathered for backward (ZeRO-3).
- shard_grad_op: 1-D mesh ``(shard=W)``, ``reshard_after_forward=False``:
  gathered parameters stay until backward; gradients and optimizer state are
  sharded (ZeRO-2 memory for parameters during the step, one all-gather fewer).
- no_shard: 2-D mesh ``(replicate=W, shard=1)``: every rank holds whole
  parameters and gradients are all-reduced over the replicate dim, i.e. DDP
  semantics on the same FSDP2 machinery (so checkpoints and the train loop do
  not change).
- hybrid: 2-D mesh ``(replicate=W/G, shard=G)``, ``reshard_after_forward=True``,
  with G the shard group (``fsdp.shardGroupSize``, by default one node's
  ranks): ZeRO-3 inside each group (reduce-scatter inside a node), all-reduce
  across groups.

A single process with no CPU offload gets no FSDP at all (a plain module):
that is the non-sharded reference the parity tests compare against.

Torch-free, so the config checks can use it before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdp_api.spec import FSDPSpec

# Mesh dimension names: FSDP shards along "shard" and replicates along "replicate".
REPLICATE = "replicate"
SHARD = "shard"


@dataclass(frozen=True)
class ParallelPlan:
    fsdp: FSDPSpec
    world_size: int
    local_world_size: int

    @property
    def strategy(self) -> str:
        return self.fsdp.sharding_strategy

    @property
    def uses_fsdp(self) -> bool:
        """FSDP wraps the model unless one process holds it all in device memory anyway."""
        return self.world_size > 1 or self.fsdp.cpu_offload

    @property
    def shard_group_size(self) -> int:
        """Ranks per shard group of the hybrid mesh: fsdp.shardGroupSize or one node's processes."""
        return self.fsdp.shard_group_size or self.local_world_size

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        if self.strategy in ("full", "shard_grad_op"):
            return (self.world_size,)
        if self.strategy == "no_shard":
            return (self.world_size, 1)
        group = self.shard_group_size
        return (self.world_size // group, group)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return (SHARD,) if len(self.mesh_shape) == 1 else (REPLICATE, SHARD)

    @property
    def reshard_after_forward(self) -> bool:
        """For the decoder layers; the root module is never resharded after forward."""
        return self.strategy != "shard_grad_op"

    def describe(self) -> dict[str, int]:
        """The mesh as {dim name: size}, for the log."""
        return dict(zip(self.mesh_dim_names, self.mesh_shape, strict=True))

    def errors(self) -> list[str]:
        """Why the mesh cannot be built for this launch, naming the field; empty when it can."""
        if self.strategy != "hybrid":
            return []
        group = self.shard_group_size
        source = "fsdp.shardGroupSize"
        if not self.fsdp.shard_group_size:
            source += " (unset: processes per node)"
        if group > self.world_size:
            return [f"{source}: shard group of {group} ranks is larger than the world size {self.world_size}"]
        if self.world_size % group:
            return [
                f"{source}: the world size {self.world_size} is not a multiple of the shard group size {group}, "
                "so the hybrid mesh (replicate x shard) cannot be built"
            ]
        return []


def mesh_shape(fsdp: FSDPSpec, world_size: int, local_world_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The data-parallel mesh for a sharding strategy: (shape, dim names)."""
    plan = ParallelPlan(fsdp, world_size, local_world_size)
    return plan.mesh_shape, plan.mesh_dim_names
