"""The parallel plan (fsdp_api.parallel_plan): mesh sizes, data-parallel coordinates and impossible layouts.

Torch-free, like the plan: the operator and the memory plan read it without torch.
"""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_api.parallel_plan import ParallelPlan
from fsdp_api.spec import FSDPSpec, FSDPTrainingSpec


def plan(fsdp: dict[str, Any], world: int, local: int, **degrees: int) -> ParallelPlan:
    return ParallelPlan(FSDPSpec.model_validate(fsdp), world, local, **degrees)


@pytest.mark.parametrize(
    ("fsdp", "world", "local", "dims", "shard_size", "reshard"),
    [
        ({"shardingStrategy": "full"}, 16, 8, {"shard": 16}, 16, True),
        ({"shardingStrategy": "shard_grad_op"}, 16, 8, {"shard": 16}, 16, False),
        ({"shardingStrategy": "no_shard"}, 16, 8, {"replicate": 16, "shard": 1}, 1, True),
        ({"shardingStrategy": "hybrid"}, 16, 8, {"replicate": 2, "shard": 8}, 8, True),
        ({"shardingStrategy": "hybrid", "shardGroupSize": 4}, 16, 8, {"replicate": 4, "shard": 4}, 4, True),
        ({"shardingStrategy": "full"}, 1, 1, {"shard": 1}, 1, True),
    ],
)
def test_sizes_for_each_strategy(
    fsdp: dict[str, Any], world: int, local: int, dims: dict[str, int], shard_size: int, reshard: bool
) -> None:
    p = plan(fsdp, world, local)
    assert p.describe() == dims
    assert p.dp_shape == p.mesh_shape and p.dp_dim_names == p.mesh_dim_names  # no model-parallel dims today
    assert p.dp_size == world  # every rank is a data-parallel rank
    assert p.shard_size == shard_size
    assert p.reshard_after_forward is reshard
    assert p.errors() == []


@pytest.mark.parametrize(
    ("strategy", "expected"), [("full", True), ("shard_grad_op", True), ("no_shard", False), ("hybrid", False)]
)
def test_more_ranks_shrink_the_shards_only_when_parameters_are_split_over_all_of_them(
    strategy: str, expected: bool
) -> None:
    assert plan({"shardingStrategy": strategy}, 16, 8).shards_over_all_dp_ranks is expected


def test_dp_rank_is_the_world_rank_without_model_parallelism() -> None:
    p = plan({"shardingStrategy": "hybrid"}, 16, 8)
    assert [p.dp_rank(r) for r in range(16)] == list(range(16))


def test_model_parallel_degrees_divide_the_world_before_data_parallelism() -> None:
    # 16 ranks, tp 2 x cp 2: 4 data-parallel ranks; tp peers are neighbours, then cp.
    p = plan({"shardingStrategy": "full"}, 16, 8, tp=2, cp=2)
    assert p.dp_size == 4 and p.non_dp_size == 4
    assert p.describe() == {"shard": 4, "cp": 2, "tp": 2}
    assert p.dp_dim_names == ("shard",) and p.dp_shape == (4,)
    assert [p.dp_rank(r) for r in range(16)] == [r // 4 for r in range(16)]
    # FSDP shards over the context ranks too (each computes gradients of its part of the rows):
    # the mesh the trainer builds folds cp into the shard dimension.
    assert p.shard_size == 8
    assert (p.mesh_shape, p.mesh_dim_names) == ((8, 2), ("shard", "tp"))
    # hybrid's default group is one node's data-parallel ranks: 8 processes / (tp x cp) = 2.
    h = plan({"shardingStrategy": "hybrid"}, 16, 8, tp=2, cp=2)
    assert h.shard_group_size == 2
    assert h.describe() == {"replicate": 2, "shard": 2, "cp": 2, "tp": 2}
    assert (h.mesh_shape, h.mesh_dim_names) == ((2, 4, 2), ("replicate", "shard", "tp"))
    assert h.errors() == []


def test_context_parallelism_refuses_no_shard() -> None:
    assert plan({"shardingStrategy": "no_shard"}, 4, 4, cp=2).errors() == [
        "fsdp.shardingStrategy: no_shard keeps whole parameters on every rank, but with parallelism.context "
        "FSDP shards over the context ranks: use full, shard_grad_op or hybrid"
    ]


def test_experts_split_inside_the_shard_dimension_without_dividing_the_world() -> None:
    # 16 ranks, expert 4: still 16 data-parallel ranks; each expert layer is split over 4
    # neighbours, and FSDP shards each expert over the 4 groups of them.
    p = plan({"shardingStrategy": "full"}, 16, 8, ep=4)
    assert p.dp_size == 16 and p.mesh_shape == (16,) and p.errors() == []
    assert p.describe() == {"shard": 16, "ep": 4}
    assert (p.expert_mesh_shape, p.expert_mesh_dim_names) == ((4, 4), ("efsdp", "ep"))
    # hybrid: inside each shard group (one node's 8 ranks), its copies replicated across the groups.
    h = plan({"shardingStrategy": "hybrid"}, 16, 8, ep=8)
    assert (h.expert_mesh_shape, h.expert_mesh_dim_names) == ((2, 1, 8), ("replicate", "efsdp", "ep"))
    assert h.errors() == []
    # The context ranks hold other tokens of the same rows, so they are expert-parallel peers too.
    c = plan({"shardingStrategy": "full"}, 8, 8, cp=2, ep=4)
    assert c.fsdp_shape == (8,) and c.expert_mesh_shape == (2, 4) and c.errors() == []


@pytest.mark.parametrize(
    ("fsdp", "world", "degrees", "error"),
    [
        (
            {"shardingStrategy": "full"},
            12,
            {"ep": 8},
            "parallelism.expert: 8 does not divide the 12 ranks FSDP shards over (the data-parallel ranks x context), "
            "so the experts cannot be split evenly over neighbouring ranks",
        ),
        (
            {"shardingStrategy": "hybrid", "shardGroupSize": 4},
            16,
            {"ep": 8},
            "parallelism.expert: 8 does not divide a hybrid shard group's 4 ranks FSDP shards over (the data-parallel "
            "ranks of one group x context), so the experts cannot be split evenly over neighbouring ranks",
        ),
        (
            {"shardingStrategy": "no_shard"},
            8,
            {"ep": 2},
            "fsdp.shardingStrategy: no_shard shards over no ranks, but parallelism.expert splits the experts over "
            "the ranks FSDP shards over: use full, shard_grad_op or hybrid",
        ),
        (
            {"shardingStrategy": "full"},
            8,
            {"ep": 2, "tp": 2},
            "parallelism.expert with parallelism.tensor > 1 is not supported yet: use one of the two",
        ),
    ],
)
def test_an_impossible_expert_split_has_one_clear_error(
    fsdp: dict[str, Any], world: int, degrees: dict[str, int], error: str
) -> None:
    assert plan(fsdp, world, 8, **degrees).errors() == [error]


def test_dp_rank_outside_the_world_is_refused() -> None:
    p = plan({}, 4, 4)
    for rank in (-1, 4):
        with pytest.raises(ValueError, match=f"rank {rank} is outside the world of 4 ranks"):
            p.dp_rank(rank)


@pytest.mark.parametrize(
    ("fsdp", "world", "local", "degrees", "message"),
    [
        (
            {"shardingStrategy": "hybrid", "shardGroupSize": 8},
            4,
            4,
            {},
            "fsdp.shardGroupSize: shard group of 8 ranks is larger than the world size 4",
        ),
        (
            {"shardingStrategy": "hybrid"},
            4,
            3,
            {},
            "fsdp.shardGroupSize (unset: processes per node): the world size 4 is not a multiple of the shard "
            "group size 3, so the hybrid mesh (replicate x shard) cannot be built",
        ),
        (
            {"shardingStrategy": "full"},
            6,
            6,
            {"tp": 4},
            "the world size 6 is not a multiple of pipeline x tp x cp = 1 x 4 x 1, so the data-parallel size is not a "
            "whole number",
        ),
        (
            {"shardingStrategy": "hybrid", "shardGroupSize": 3},
            16,
            8,
            {"tp": 2},
            "fsdp.shardGroupSize: the data-parallel size 8 (world size / pipeline x tp x cp) is not a multiple of "
            "the shard group size 3, so the hybrid mesh (replicate x shard) cannot be built",
        ),
        ({}, 0, 1, {}, "the launch has 0 ranks, 1 per node: both must be >= 1"),
    ],
)
def test_an_impossible_layout_has_one_clear_error(
    fsdp: dict[str, Any], world: int, local: int, degrees: dict[str, int], message: str
) -> None:
    assert plan(fsdp, world, local, **degrees).errors() == [message]


def test_an_impossible_hybrid_layout_still_gets_a_shard_size_for_the_estimate() -> None:
    # The memory plan estimates before anything checks the launch: the group is capped at the world.
    assert plan({"shardingStrategy": "hybrid", "shardGroupSize": 8}, 4, 4).shard_size == 4


def test_for_spec_is_the_launch_the_spec_describes() -> None:
    spec = FSDPTrainingSpec.model_validate(
        {
            "image": "trainer:1.0",
            "model": {"preset": "llama3.2-1b"},
            "training": {"maxSteps": 10},
            "fsdp": {"shardingStrategy": "hybrid"},
            "resources": {"nodes": 2, "gpusPerNode": 8},
        }
    )
    p = ParallelPlan.for_spec(spec)
    assert (p.world_size, p.local_world_size, p.dp_size) == (16, 8, 16)
    assert p.describe() == {"replicate": 2, "shard": 8}
    cpu = ParallelPlan.for_spec(
        spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus_per_node": 0})})
    )
    assert (cpu.world_size, cpu.local_world_size) == (2, 1)  # one process per CPU pod


def test_a_tensor_parallel_group_must_stay_inside_a_node() -> None:
    assert plan({"shardingStrategy": "full"}, 16, 2, tp=4).errors() == [
        "parallelism.tensor: 4 does not divide the 2 processes per node: a tensor-parallel group must stay inside "
        "one node (it all-reduces activations twice per decoder block, too often for the network between nodes)"
    ]


def test_for_spec_reads_the_tensor_degree() -> None:
    spec = FSDPTrainingSpec.model_validate(
        {
            "image": "trainer:1.0",
            "model": {"preset": "llama3.2-1b"},
            "training": {"maxSteps": 10},
            "parallelism": {"tensor": 4},
            "resources": {"nodes": 2, "gpusPerNode": 8},
        }
    )
    p = ParallelPlan.for_spec(spec)
    assert p.describe() == {"shard": 4, "tp": 4}
    assert (p.dp_size, p.dp_rank(5), p.dp_rank(8)) == (4, 1, 2)
    assert p.errors() == []


def test_pipeline_stages_are_the_outermost_blocks_of_ranks() -> None:
    # 2 nodes of 8: 2 stages (one per node), each 4 data-parallel ranks x 2 tensor-parallel peers.
    p = plan({"shardingStrategy": "full"}, 16, 8, pp=2, tp=2)
    assert p.mesh_shape == (2, 4, 2)
    assert p.mesh_dim_names == ("pp", "shard", "tp")
    assert p.describe() == {"shard": 4, "pp": 2, "tp": 2}
    assert (p.dp_size, p.stage_size) == (4, 8)
    assert [p.pp_rank(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    # Every stage of a data-parallel rank reads its batch; stage 0 holds them in order (what resume maps).
    assert [p.dp_rank(r) for r in range(16)] == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    assert p.errors() == []


def test_a_pipeline_stages_default_hybrid_group_is_no_larger_than_its_data_parallel_ranks() -> None:
    # 4 stages on one node of 8: 2 data-parallel ranks a stage; the default group (a node's) is capped at them.
    p = plan({"shardingStrategy": "hybrid"}, 8, 8, pp=4)
    assert p.shard_group_size == 2
    assert p.errors() == []
    assert plan({"shardingStrategy": "hybrid"}, 8, 8).shard_group_size == 8  # unchanged without stages
    assert plan({"shardingStrategy": "full"}, 6, 6, pp=4).errors() == [
        "the world size 6 is not a multiple of pipeline x tp x cp = 4 x 1 x 1, so the data-parallel size is not a "
        "whole number"
    ]
