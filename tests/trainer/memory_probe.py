"""Measure the peak tensor memory of real training steps on CPU (run under torchrun, one JSON line per rank).

The trainer's own code builds and trains the model: ``prepare`` and
``Trainer`` (meta model, activation checkpointing, FSDP2, materialise and
init, AdamW, data), then ``Trainer.train_step``. The measurement is the CPU
allocator's own count: with ``profile_memory`` on, PyTorch's CPU allocator
reports every allocation and free to the profiler together with the running
total of bytes it has handed out since profiling began. Profiling starts
before the model gets any storage, so the largest running total is the peak
of everything the trainer allocated on this thread: parameters, gradients,
optimizer state, activations, FSDP's gather buffers and the temporaries of
every op (including those inside an op, which a tensor-level tracker would
not see). What it does not see: allocations of other threads (the data
prefetch thread's batches) and gloo's own buffers.

    torchrun --nproc-per-node 2 tests/trainer/memory_probe.py train.yaml out-dir
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.build import prepare
from fsdp_trainer.footprint import state_bytes
from fsdp_trainer.parallel.distributed import destroy_distributed, init_distributed
from fsdp_trainer.train import Trainer
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

STEPS = 3  # the first creates AdamW's state; later ones are the steady state


def _walk(nodes: list[Any]) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def peak_allocated(prof: profile) -> tuple[int, int]:
    """(largest running total, number of allocation events) of the CPU allocator during ``prof``."""
    tree = prof.profiler.kineto_results.experimental_event_tree()
    allocations = [n.extra_fields.total_allocated for n in _walk(tree) if n.tag == _EventType.Allocation]
    return max(allocations, default=0), len(allocations)


def measure(config_path: Path) -> dict[str, Any]:
    cfg = TrainerConfig.from_yaml(config_path.read_text())
    prepared = prepare(cfg)
    init_distributed(prepared.world)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer = Trainer(prepared)
            for step in range(1, STEPS + 1):
                trainer.train_step(step)
        params, optim = state_bytes(trainer.model, trainer.optimizer)
        trainer.close()
    finally:
        destroy_distributed()
    peak, events = peak_allocated(prof)
    return {
        "rank": prepared.world.rank,
        "peak_bytes": peak,
        "allocation_events": events,
        "param_bytes": params,
        "optim_bytes": optim,
    }


def main() -> None:
    config_path, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    result = measure(config_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"memory-rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
