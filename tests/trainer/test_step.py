"""The step seam (``fsdp_trainer.step``): the named reduction slots and the choice of strategy.

That the step trains as before is the parity runs' to show (a 2-rank run against one process,
exact resume, context parallelism against whole rows); here the slots' own contract, on a
one-process gloo group, two ranks in ``test_the_slots_sum_over_ranks_in_one_all_reduce``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fsdp_api.ports import free_port
from fsdp_trainer.parallel.context_parallel import ContextParallel
from fsdp_trainer.step import ContextParallelStep, PlainStep, StepReductions, step_strategy
from torch import nn


@pytest.fixture
def one_rank() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_each_slot_comes_back_under_its_name_scalars_vectors_and_empty_ones(one_rank: None) -> None:
    slots = StepReductions(torch.device("cpu"))
    slots.sum("loss", torch.tensor(2.5))
    slots.sum("stop", 1.0)
    slots.sum("pairs", torch.zeros(0))
    slots.sum("waits", torch.tensor([0.25, 0.5]))
    slots.read("grad_norm", torch.tensor(3.0, dtype=torch.float64))
    assert slots.exchange() == {"loss": [2.5], "stop": [1.0], "pairs": [], "waits": [0.25, 0.5], "grad_norm": [3.0]}
    # Emptied by the exchange: the next step fills the same names again.
    slots.read("grad_norm", 1.0)
    assert slots.exchange() == {"grad_norm": [1.0]}


def test_a_slot_filled_twice_is_refused(one_rank: None) -> None:
    slots = StepReductions(torch.device("cpu"))
    slots.sum("loss", 1.0)
    with pytest.raises(ValueError, match="slot 'loss' is filled twice"):
        slots.read("loss", 2.0)


def _two_ranks(rank: int, port: int, out: dict[int, dict[str, list[float]]]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    slots = StepReductions(torch.device("cpu"))
    slots.sum("loss", float(rank + 1))
    waits = torch.zeros(2)
    waits[rank] = 0.5 * (rank + 1)
    slots.sum("waits", waits)
    slots.read("mine", float(10 * rank))
    out[rank] = slots.exchange()
    dist.destroy_process_group()


@pytest.mark.slow  # two processes, each importing torch (over the unit tier's limit)
def test_the_slots_sum_over_ranks_in_one_all_reduce() -> None:
    with mp.Manager() as manager:
        out = manager.dict()
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mp.spawn(_two_ranks, args=(free_port(), out), nprocs=2, join=True)
        got = dict(out)
    assert got == {
        0: {"loss": [3.0], "waits": [0.5, 1.0], "mine": [0.0]},
        1: {"loss": [3.0], "waits": [0.5, 1.0], "mine": [10.0]},
    }


def test_the_strategy_follows_the_plan_context_parallel_only_where_rows_are_split() -> None:
    model, cpu = nn.Linear(2, 2), torch.device("cpu")
    assert type(step_strategy(model, "fp32", cpu, None, None)) is PlainStep
    context = cast(ContextParallel, object())
    split = step_strategy(model, "fp32", cpu, None, context)
    assert isinstance(split, ContextParallelStep) and split.context is context
