"""What a rank holds: the bytes of its parameter shards and optimizer state, and a digest of its frozen part.

For the run record (``trace.py``) and the memory probe of the tests: not read by the step.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from .param_names import unique_parameters
from .shards import local_tensor


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """Bytes of this rank's parameter shards and optimizer state."""
    params = sum(local_tensor(p).numel() * local_tensor(p).element_size() for _, p in unique_parameters(model))
    optim = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                t = local_tensor(value)
                optim += t.numel() * t.element_size()
    return params, optim


def frozen_digest(model: nn.Module) -> str | None:
    """SHA-256 of this rank's shards of the frozen parameters (None: nothing is frozen); for the trace."""
    frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
    if not frozen:
        return None
    digest = hashlib.sha256()
    for name, param in frozen:
        digest.update(name.encode())
        digest.update(local_tensor(param).detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
