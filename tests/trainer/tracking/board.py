"""Reading a TensorBoard folder back as TensorBoard shows it."""

from __future__ import annotations

from pathlib import Path


def read_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """The points TensorBoard itself shows for ``tag``: its own reader, purges applied."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]
