"""Where this process sits in the job, the process group, and the device mesh.

torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK for each
worker. A Kubeflow PyTorchJob that runs the trainer without torchrun gives one
process per pod and only RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (and
``PET_NODE_RANK``); both are understood. With none of them the trainer is a
single process, which is also how the non-sharded reference runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def world_from_env(env: Mapping[str, str] = os.environ, *, use_cuda: bool | None = None) -> WorldInfo:
    """This process's place in the job, from torchrun's or Kubeflow's variables."""
    rank = _int(env, "RANK", default=0)
    world_size = _int(env, "WORLD_SIZE", default=1)
    if "LOCAL_RANK" in env:
        local_rank = _int(env, "LOCAL_RANK", default=0)
        local_world_size = _int(env, "LOCAL_WORLD_SIZE", default=1)
    else:
        # Kubeflow without torchrun: one process per pod, RANK is the pod index.
        local_rank, local_world_size = 0, 1
    node_rank = _int(env, "GROUP_RANK", "PET_NODE_RANK", "NODE_RANK", default=rank // max(1, local_world_size))
    num_nodes = _int(env, "GROUP_WORLD_SIZE", "PET_NNODES", default=max(1, world_size // max(1, local_world_size)))
    if use_cuda is None:
        use_cuda = torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", local_rank)
        # gloo next to NCCL lets CPU tensors (async checkpoint staging, object
        # broadcasts) use collectives without a device round trip.
        backend = "cuda:nccl,cpu:gloo"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    return WorldInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        device=device,
        backend=backend,
    )


def init_distributed(world: WorldInfo, timeout_minutes: int = 30) -> None:
    """Create the default process group (also for a single process, so every code path is the same)."""
    if dist.is_initialized():
        return
    if world.device.type == "cuda":
        torch.cuda.set_device(world.device)
    timeout = timedelta(minutes=timeout_minutes)
    device_id = world.device if world.device.type == "cuda" else None
    if world.world_size == 1 and "MASTER_ADDR" not in os.environ:
        # No rendezvous to join: an in-process store needs no port.
        dist.init_process_group(world.backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(
            world.backend,
            store=_attempt_store(timeout),
            rank=world.rank,
            world_size=world.world_size,
            timeout=timeout,
            device_id=device_id,
        )
    else:
        dist.init_process_group(
            world.backend, rank=world.rank, world_size=world.world_size, timeout=timeout, device_id=device_id
        )


def _attempt_store(timeout: timedelta) -> dist.Store:
    """torchrun's store, with keys private to this restart of the worker group.

    torchrun keeps one store for the job and hands every restarted worker
    group the same address. Without a per-attempt prefix the new processes
    find the previous attempt's gloo/NCCL rendezvous keys (addresses of dead
    processes) and hang connecting to them, so a worker restart never trains.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        is_master=False,  # the agent hosts it
        timeout=timeout,
    )
    return dist.PrefixStore(f"fsdp_trainer/attempt_{attempt}", store)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: WorldInfo) -> None:
    if world.device.type == "cuda":
        dist.barrier(device_ids=[world.device.index])
    else:
        dist.barrier()


def max_over_ranks(value: int, world: WorldInfo) -> int:
    """The largest ``value`` of all ranks, on every rank (one all-reduce)."""
    box = torch.tensor([value], dtype=torch.int64, device=world.device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return int(box.item())


def all_ranks(ok: bool, world: WorldInfo) -> bool:
    """True on every rank when ``ok`` is True on every rank."""
    return max_over_ranks(0 if ok else 1, world) == 0


def true_on_every_rank(flags: list[bool], world: WorldInfo) -> list[bool]:
    """Element-wise: True where every rank's ``flags`` (all of one length) say True (one all-reduce)."""
    if not flags:
        return []
    box = torch.tensor([0 if f else 1 for f in flags], dtype=torch.int64, device=world.device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return [v == 0 for v in box.tolist()]


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s value of ``obj`` on every rank (every rank passes a value of the same type)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
