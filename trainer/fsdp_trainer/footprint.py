"""What a rank holds: the bytes of its parameter shards and optimizer state, a digest of its frozen part,
and the logits of a fixed probe input.

For the run record (``trace.py``), export's check and the memory probe of the tests: not read by the step.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from .model.param_names import unique_parameters
from .model.shards import local_tensor
from .parallel.parallelize import compute_context, reshard


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


@torch.no_grad()
def write_probe(model: PreTrainedModel, precision: str, device: torch.device, directory: Path, is_main: bool) -> None:
    """Logits of a fixed input (rank 0 saves them as ``probe.pt``): export must reproduce them (collective)."""
    vocab = model.config.get_text_config().vocab_size  # multimodal configs keep it in the text part
    inputs = (torch.arange(2 * 16, device=device).view(2, 16) * 37 + 11) % vocab
    model.eval()
    with compute_context(model, precision, device):
        logits = model(input_ids=inputs).logits.float().cpu()
    model.train()
    reshard(model)
    if is_main:
        torch.save({"input_ids": inputs.cpu(), "logits": logits}, directory / "probe.pt")
