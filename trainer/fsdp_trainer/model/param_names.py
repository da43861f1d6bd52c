"""Parameter names as checkpoints and Hugging Face know them.

Activation checkpointing and torch.compile wrap modules and insert
``_checkpoint_wrapped_module.`` / ``_orig_mod.`` into parameter names; the
canonical name drops them, so init seeds, pretrained weights and exported
files all agree whatever wrappers were applied.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def unique_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(canonical name, parameter), each shared (tied) parameter once under its first name."""
    for name, param in model.named_parameters():  # named_parameters already skips duplicates
        yield canonical(name), param
