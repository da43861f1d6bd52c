"""What a training's spec means for the device mesh: the one reading of ``fsdp.shardingStrategy``.

``ParallelPlan`` (torchtitan's ``ParallelDims`` was the model) is built from
the FSDP section and the launch (world size, processes per node). It answers
every question the trainer, its metrics and the memory plan ask about the
layout: whether FSDP is used at all, the mesh's dimension names and sizes,
the shard group of ``hybrid``, ``reshard_after_forward``, the data-parallel
coordinates (``dp_size``, ``dp_rank``), and whether the launch can build the
mesh at all (checked before any process group exists).

The data-parallel dimensions per strategy, with D the data-parallel size:

- full: ``(shard=D)``, ``reshard_after_forward=True``: parameters are freed
  after each layer's forward and gathered again for backward (ZeRO-3).
- shard_grad_op: ``(shard=D)``, ``reshard_after_forward=False``: gathered
  parameters stay until backward; gradients and optimizer state are sharded
  (ZeRO-2 for parameters during the step, one all-gather fewer).
- no_shard: ``(replicate=D, shard=1)``: whole parameters on every rank,
  gradients all-reduced over ``replicate``: DDP semantics on the same FSDP2
  machinery, so checkpoints and the train loop do not change.
- hybrid: ``(replicate=D/G, shard=G)``, ``reshard_after_forward=True``, with
  G the shard group (``fsdp.shardGroupSize``, by default one node's ranks):
  ZeRO-3 inside a group (reduce-scatter inside a node), all-reduce across.

A single process with no CPU offload gets no FSDP at all (a plain module):
the non-sharded reference the parity tests compare against.

Tensor and context parallelism (``tp``: ``parallelism.tensor``, ``cp``:
``parallelism.context``): their ranks share one data-parallel rank's batch
and split its work, so they divide the world before data parallelism does:
``dp_size = world / (cp * tp)``. Ranks fill the layout row-major in the order
``replicate, shard, cp, tp``: the tensor-parallel peers are neighbours, inside
one node (its NVLink, not EFA: a tensor-parallel layer all-reduces its
activations twice per block), and a rank's data-parallel coordinate is
``rank // (cp * tp)``.

The context ranks of one data-parallel rank each compute the gradient of
their part of its rows, so FSDP reduces over them too: its shard dimension
takes in the context ranks (``shard * cp``, torchtitan's ``dp_shard_cp``).
Because ``cp`` sits right after ``shard`` in the row-major order, that is a
plain dimension of the mesh the trainer builds (``mesh_shape``); the context
groups themselves are the trainer's (``fsdp_trainer.parallel.plan``). A
dimension of degree 1 is left out, so without model parallelism the mesh is
exactly the data-parallel one. A new degree is one field here, its place in
``mesh_dim_names`` and a check in ``errors``.

Expert parallelism (``ep``: ``parallelism.expert``) does not divide the
world: the experts of each layer are split over ``ep`` neighbouring ranks of
FSDP's shard dimension, which hold different tokens and exchange them by
all-to-all. The experts get a mesh of their own over the same ranks
(``expert_mesh_shape``, transformers' ``TransformersDeviceMesh`` was the
model): ``(replicate, efsdp, ep)``, where ``efsdp = shard / ep`` is what FSDP
shards each expert over, so a shard dimension of 8 with ``ep = 4`` holds two
copies of each expert group, each expert split in two. The dense layers keep
the data-parallel mesh unchanged.

Pipeline parallelism (``pp``: ``parallelism.pipeline``) splits the model's
layers into ``pp`` stages, one per block of ``world / pp`` consecutive ranks:
the outermost dimension of the mesh, so a stage's data- and tensor-parallel
peers stay neighbours (inside a node where they fit) and only the stage
boundaries' activations cross between blocks. Every stage of a data-parallel
rank reads the same batch, so ``dp_size = world / (pp * cp * tp)`` and a
rank's data-parallel coordinate is its position inside its stage's block;
the first block (stage 0) holds the data-parallel ranks in order, which is
what lets a checkpoint written with ``pp`` stages resume with one.

Torch-free: the operator, the memory plan and the trainer's config checks use
it before anything heavy is imported; the trainer builds the torch mesh from
it (``fsdp_trainer.parallel.plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .spec import FSDPSpec, ParallelismSpec

if TYPE_CHECKING:
    from .spec import FSDPTrainingSpec

# Mesh dimension names. FSDP shards along "shard" and replicates along "replicate".
REPLICATE = "replicate"
SHARD = "shard"
CP = "cp"
PP = "pp"
TP = "tp"
# The experts' mesh: FSDP over EFSDP (and REPLICATE under hybrid), whole experts split over EP.
EFSDP = "efsdp"
EP = "ep"


@dataclass(frozen=True)
class ParallelPlan:
    fsdp: FSDPSpec
    world_size: int
    local_world_size: int
    # Degrees of tensor and context parallelism (see the module doc).
    tp: int = 1
    cp: int = 1
    ep: int = 1
    pp: int = 1

    @classmethod
    def of(cls, fsdp: FSDPSpec, parallelism: ParallelismSpec, world_size: int, local_world_size: int) -> ParallelPlan:
        """The plan of the spec's (or trainer config's) sections on a launch of ``world_size`` ranks."""
        return cls(
            fsdp,
            world_size,
            local_world_size,
            tp=parallelism.tensor,
            cp=parallelism.context,
            ep=parallelism.expert,
            pp=parallelism.pipeline,
        )

    @classmethod
    def for_spec(cls, spec: FSDPTrainingSpec) -> ParallelPlan:
        """The plan of a training as the spec launches it: one process per GPU (or one per CPU pod)."""
        return cls.of(spec.fsdp, spec.parallelism, spec.world_size(), spec.procs_per_node())

    @property
    def strategy(self) -> str:
        return self.fsdp.sharding_strategy

    @property
    def uses_fsdp(self) -> bool:
        """FSDP wraps the model unless one process holds it all in device memory anyway."""
        return self.world_size > 1 or self.fsdp.cpu_offload

    # --- data-parallel coordinates ---------------------------------------------------------

    @property
    def non_dp_size(self) -> int:
        """Ranks that share one data-parallel rank's batch (its pipeline, tensor- and context-parallel peers)."""
        return self.pp * self.cp * self.tp

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage (every rank without pipelining)."""
        return self.world_size // self.pp

    def pp_rank(self, rank: int) -> int:
        """The pipeline stage a (world) rank runs."""
        return rank // self.stage_size

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the data loader's shards, and the ranks FSDP averages gradients over."""
        return self.world_size // self.non_dp_size

    def dp_rank(self, rank: int) -> int:
        """The data-parallel coordinate of a (world) rank: which shard of the data it reads."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the world of {self.world_size} ranks")
        return (rank % self.stage_size) // (self.cp * self.tp)

    # --- the mesh --------------------------------------------------------------------------

    @property
    def shard_group_size(self) -> int:
        """Ranks per shard group of the hybrid mesh: fsdp.shardGroupSize or one node's data-parallel ranks."""
        # A node's data-parallel ranks, but no more than one pipeline stage has.
        node = max(1, self.local_world_size // (self.cp * self.tp))
        return self.fsdp.shard_group_size or min(node, self.dp_size)

    @property
    def dp_shape(self) -> tuple[int, ...]:
        """The data-parallel dimensions' sizes (the mesh FSDP shards and replicates over)."""
        if self.strategy in ("full", "shard_grad_op"):
            return (self.dp_size,)
        if self.strategy == "no_shard":
            return (self.dp_size, 1)
        group = self.shard_group_size
        return (self.dp_size // group, group)

    @property
    def dp_dim_names(self) -> tuple[str, ...]:
        return (SHARD,) if len(self.dp_shape) == 1 else (REPLICATE, SHARD)

    @property
    def fsdp_shape(self) -> tuple[int, ...]:
        """FSDP's dimensions: the data-parallel ones, with the context ranks in the shard dimension."""
        return (*self.dp_shape[:-1], self.dp_shape[-1] * self.cp)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The device mesh the trainer builds: the pipeline stages, FSDP's dimensions, then the tensor-parallel one."""
        return ((self.pp,) if self.pp > 1 else ()) + self.fsdp_shape + ((self.tp,) if self.tp > 1 else ())

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return ((PP,) if self.pp > 1 else ()) + self.dp_dim_names + ((TP,) if self.tp > 1 else ())

    def _model_parallel_dims(self) -> list[tuple[str, int]]:
        dims = ((PP, self.pp), (CP, self.cp), (TP, self.tp), (EP, self.ep))
        return [(name, size) for name, size in dims if size > 1]

    # --- the experts' mesh -----------------------------------------------------------------

    @property
    def expert_mesh_shape(self) -> tuple[int, ...]:
        """The experts' mesh over the FSDP ranks: ``(replicate, efsdp, ep)``, the ``ep`` peers neighbours."""
        *outer, shard = self.fsdp_shape
        return (*outer, shard // self.ep, self.ep)

    @property
    def expert_mesh_dim_names(self) -> tuple[str, ...]:
        return (*self.dp_dim_names[:-1], EFSDP, EP)

    @property
    def shards_over_all_dp_ranks(self) -> bool:
        """Each parameter is split over every data-parallel rank (full, shard_grad_op): more ranks, smaller shards."""
        return self.dp_dim_names == (SHARD,)

    @property
    def shard_size(self) -> int:
        """Ranks one parameter is split over (1: whole on every rank), for the memory estimate.

        Capped at the data-parallel size, so a layout ``errors`` refuses still gets an estimate.
        """
        if not self.uses_fsdp:
            return 1
        return max(1, min(self.fsdp_shape[-1], self.dp_size * self.cp))

    @property
    def reshard_after_forward(self) -> bool:
        """For the decoder layers; the root module is never resharded after forward."""
        return self.strategy != "shard_grad_op"

    def describe(self) -> dict[str, int]:
        """The layout as {dim name: size}, for the log: the data-parallel dimensions, then pp, cp, tp and ep."""
        dims = list(zip(self.dp_dim_names, self.dp_shape, strict=True)) + self._model_parallel_dims()
        return dict(dims)

    def errors(self) -> list[str]:
        """Why the mesh cannot be built for this launch, naming the field; empty when it can."""
        if self.world_size < 1 or self.local_world_size < 1:
            return [f"the launch has {self.world_size} ranks, {self.local_world_size} per node: both must be >= 1"]
        if self.tp < 1 or self.cp < 1 or self.pp < 1 or self.world_size % self.non_dp_size:
            return [
                f"the world size {self.world_size} is not a multiple of pipeline x tp x cp = "
                f"{self.pp} x {self.tp} x {self.cp}, so the data-parallel size is not a whole number"
            ]
        if self.cp > 1 and self.strategy == "no_shard":
            return [
                "fsdp.shardingStrategy: no_shard keeps whole parameters on every rank, but with parallelism.context "
                "FSDP shards over the context ranks: use full, shard_grad_op or hybrid"
            ]
        if self.ep > 1 and (ep_errors := self._expert_errors()):
            return ep_errors
        if self.local_world_size % self.tp:
            return [
                f"parallelism.tensor: {self.tp} does not divide the {self.local_world_size} processes per node: "
                "a tensor-parallel group must stay inside one node (it all-reduces activations twice per "
                "decoder block, too often for the network between nodes)"
            ]
        if self.strategy != "hybrid":
            return []
        return self._hybrid_errors()

    def _expert_errors(self) -> list[str]:
        if self.tp > 1:
            return ["parallelism.expert with parallelism.tensor > 1 is not supported yet: use one of the two"]
        if self.strategy == "no_shard":
            return [
                "fsdp.shardingStrategy: no_shard shards over no ranks, but parallelism.expert splits the experts "
                "over the ranks FSDP shards over: use full, shard_grad_op or hybrid"
            ]
        shard = self.fsdp_shape[-1]
        if self.strategy == "hybrid" and self._hybrid_errors():
            return []  # the hybrid mesh itself is wrong: that is the error to report
        if shard % self.ep:
            over = "a hybrid shard group's" if self.strategy == "hybrid" else "the"
            return [
                f"parallelism.expert: {self.ep} does not divide {over} {shard} ranks FSDP shards over "
                f"(the data-parallel ranks{' of one group' if self.strategy == 'hybrid' else ''} x context), "
                "so the experts cannot be split evenly over neighbouring ranks"
            ]
        return []

    def _hybrid_errors(self) -> list[str]:
        group = self.shard_group_size
        source = "fsdp.shardGroupSize"
        if not self.fsdp.shard_group_size:
            source += " (unset: processes per node)"
        size = (
            f"the world size {self.world_size}"
            if self.non_dp_size == 1
            else f"the data-parallel size {self.dp_size} (world size / pipeline x tp x cp)"
        )
        if group > self.dp_size:
            return [f"{source}: shard group of {group} ranks is larger than {size}"]
        if self.dp_size % group:
            return [
                f"{source}: {size} is not a multiple of the shard group size {group}, "
                "so the hybrid mesh (replicate x shard) cannot be built"
            ]
        return []


def mesh_shape(fsdp: FSDPSpec, world_size: int, local_world_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The data-parallel mesh for a sharding strategy: (shape, dim names)."""
    plan = ParallelPlan(fsdp, world_size, local_world_size)
    return plan.mesh_shape, plan.mesh_dim_names
