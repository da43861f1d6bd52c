"""Copying full tensors into (possibly sharded) parameters, one tensor at a time.

Weight init and pretrained loading both produce a parameter's full value
tensor by tensor and keep only this rank's piece, so no rank ever holds the
whole model. Works for FSDP2 DTensors (1-D or HSDP 2-D meshes) and for plain
tensors (the single-process case).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


def local_slices(param: torch.Tensor) -> tuple[slice, ...]:
    """The index of this rank's piece of ``param`` within its full shape."""
    if not isinstance(param, DTensor):
        return tuple(slice(0, n) for n in param.shape)
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """The storage this rank owns (a view: writing to it writes the parameter)."""
    return param.to_local() if isinstance(param, DTensor) else param


@torch.no_grad()
def copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Write this rank's piece of ``full`` into ``param``."""
    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(f"shape {tuple(full.shape)} does not match the parameter's {tuple(param.shape)}")
    local = local_tensor(param)
    piece = full[local_slices(param)]
    local.copy_(piece.to(device=local.device, dtype=local.dtype))


def full_tensor(param: torch.Tensor) -> torch.Tensor:
    """The whole value (an all-gather for DTensors: collective, every rank must call it)."""
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()
