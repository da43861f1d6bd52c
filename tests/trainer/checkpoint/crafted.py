"""Checkpoints as an attacker with write access to the checkpoint volume would leave them.

Each payload runs its command (it creates a marker file) and then returns the
real value, so a reader that unpickles it sees nothing wrong: the attack is
invisible unless the reader refuses the file.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch


class Payload:
    """Pickles as a call of ``eval``: touch ``marker``, then evaluate to ``value``."""

    def __init__(self, marker: Path, value: Any) -> None:
        self.marker, self.value = marker, value

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (eval, (f"__import__('pathlib').Path({str(self.marker)!r}).touch() or {self.value!r}",))


class _MetadataPayload:
    """Pickles as a call of ``eval`` that touches ``marker`` and returns the real metadata."""

    def __init__(self, marker: Path, real: bytes) -> None:
        self.marker, self.real = marker, real

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        code = f"__import__('pathlib').Path({str(self.marker)!r}).touch() or __import__('pickle').loads({self.real!r})"
        return (eval, (code,))


def plant_in_metadata(ckpt: Path, marker: Path) -> None:
    """Replace ``ckpt/.metadata`` with one that runs code and then yields the original."""
    path = ckpt / ".metadata"
    path.write_bytes(pickle.dumps(_MetadataPayload(marker, path.read_bytes())))


def plant_in_item(ckpt: Path, fqn: str, marker: Path) -> None:
    """Replace the non-tensor item ``fqn`` (e.g. ``train.step``) in its ``.distcp`` file with a payload.

    The payload returns the item's real value; the byte ranges of the items
    after it in the same file, and the metadata that records them, are moved.
    """
    meta_path = ckpt / ".metadata"
    metadata = pickle.loads(meta_path.read_bytes())  # our own checkpoint: plain pickle is fine here
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data[index]
    shard = ckpt / info.relative_path
    data = shard.read_bytes()
    real = torch.load(io.BytesIO(data[info.offset : info.offset + info.length]), weights_only=True)
    buffer = io.BytesIO()
    torch.save(Payload(marker, real), buffer)
    evil = buffer.getvalue()
    shard.write_bytes(data[: info.offset] + evil + data[info.offset + info.length :])
    shift = len(evil) - info.length
    for i, other in metadata.storage_data.items():
        if other.relative_path == info.relative_path and other.offset > info.offset:
            metadata.storage_data[i] = replace(other, offset=other.offset + shift)
    metadata.storage_data[index] = replace(info, length=len(evil))
    meta_path.write_bytes(pickle.dumps(metadata))
