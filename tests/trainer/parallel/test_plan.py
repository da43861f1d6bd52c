"""The parallel plan (mesh per sharding strategy) and the launch environments, without processes."""

from __future__ import annotations

import pytest
import torch
from fsdp_api.parallel_plan import ParallelPlan, mesh_shape
from fsdp_api.spec import FSDPSpec
from fsdp_trainer.parallel.distributed import world_from_env


@pytest.mark.parametrize(
    ("fsdp", "world", "local", "expected"),
    [
        ({"shardingStrategy": "full"}, 16, 8, ((16,), ("shard",))),
        ({"shardingStrategy": "shard_grad_op"}, 16, 8, ((16,), ("shard",))),
        ({"shardingStrategy": "no_shard"}, 16, 8, ((16, 1), ("replicate", "shard"))),
        ({"shardingStrategy": "hybrid"}, 16, 8, ((2, 8), ("replicate", "shard"))),
        ({"shardingStrategy": "hybrid", "shardGroupSize": 4}, 16, 8, ((4, 4), ("replicate", "shard"))),
    ],
)
def test_mesh_for_each_strategy(fsdp: dict, world: int, local: int, expected: tuple) -> None:
    assert mesh_shape(FSDPSpec.model_validate(fsdp), world, local) == expected


def test_world_from_torchrun_kubeflow_and_nothing() -> None:
    torchrun = {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}
    w = world_from_env(torchrun, use_cuda=False)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.node_rank, w.num_nodes) == (11, 16, 3, 8, 1, 2)
    assert w.backend == "gloo" and w.device == torch.device("cpu")
    # A PyTorchJob without torchrun: one process per pod, RANK is the pod index.
    w = world_from_env(
        {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "PET_NODE_RANK": "2"}, use_cuda=False
    )
    assert (w.rank, w.local_rank, w.local_world_size, w.node_rank, w.num_nodes) == (2, 0, 1, 2, 4)
    w = world_from_env({}, use_cuda=True)
    assert (w.rank, w.world_size) == (0, 1)
    assert w.device == torch.device("cuda", 0) and w.backend == "cuda:nccl,cpu:gloo"


def _plan(fsdp: dict, world: int, local: int) -> ParallelPlan:
    return ParallelPlan(FSDPSpec.model_validate(fsdp), world, local)


def test_plan_decides_fsdp_use_resharding_and_shard_groups() -> None:
    assert not _plan({}, 1, 1).uses_fsdp  # the non-sharded reference: a plain module
    assert _plan({"cpuOffload": True}, 1, 1).uses_fsdp
    assert _plan({}, 2, 2).uses_fsdp
    assert _plan({"shardingStrategy": "full"}, 8, 8).reshard_after_forward
    assert not _plan({"shardingStrategy": "shard_grad_op"}, 8, 8).reshard_after_forward
    assert _plan({"shardingStrategy": "hybrid"}, 16, 8).shard_group_size == 8
    assert _plan({"shardingStrategy": "hybrid", "shardGroupSize": 4}, 16, 8).describe() == {"replicate": 4, "shard": 4}
    # Only hybrid has a shape that the launch can contradict.
    assert _plan({"shardingStrategy": "full"}, 3, 2).errors() == []
    assert _plan({"shardingStrategy": "hybrid"}, 16, 8).errors() == []
    assert _plan({"shardingStrategy": "hybrid"}, 4, 3).errors() == [
        "fsdp.shardGroupSize (unset: processes per node): the world size 4 is not a multiple of the shard group "
        "size 3, so the hybrid mesh (replicate x shard) cannot be built"
    ]
