"""What a step learns of its peers before it computes: how long this rank waited for the last to arrive."""

from __future__ import annotations

import time
from typing import Protocol

import torch
import torch.distributed as dist


class WaitingGauge(Protocol):
    def set_waiting(self, since: float | None) -> None: ...


def wait_for_peers(world_size: int, device: torch.device, metrics: WaitingGauge) -> float:
    """Seconds this rank waited at the step's start for the last rank to arrive (the straggler signal).

    A tiny all-reduce that every rank enters once its batch is ready: the
    rank that arrives last waits least, and the difference to the first is
    how long its peers waited for it (docs/operator.md, "Stragglers").
    ``item()`` makes the host wait for it, so the time is the peers' and
    not a queue on the device; the device is idle here anyway, having
    finished the previous step before its loss was read.
    """
    if world_size == 1:
        return 0.0
    # While it waits, the endpoint says since when: a hang elsewhere leaves this rank here, and the
    # operator's Stalled message tells the waiting ranks from the one they wait for.
    metrics.set_waiting(time.time())
    started = time.perf_counter()
    arrived = torch.ones((), device=device)
    dist.all_reduce(arrived)
    arrived.item()
    waited = time.perf_counter() - started
    metrics.set_waiting(None)
    return waited


def non_finite_loss(loss_value: float, step: int, *, first: bool) -> str:
    """Why training stops on a NaN/inf loss; the first step of a run (``first``) was computed before any update."""
    if first:
        return (
            f"loss is {loss_value} at step {step}, before this run's first update: the model as loaded or "
            "initialised gives it, not the learning rate (non-finite weights in the checkpoint, or state "
            "the architecture computes that did not survive the meta-device build); stopping"
        )
    return f"loss is {loss_value} at step {step}; stopping (lower training.learningRate?)"
