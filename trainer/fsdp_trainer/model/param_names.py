"""Parameter names as checkpoints and Hugging Face know them.

Activation checkpointing and torch.compile wrap modules and insert
``_checkpoint_wrapped_module.`` / ``_orig_mod.`` into parameter names; the
canonical name drops them, so init seeds, pretrained weights and exported
files all agree whatever wrappers were applied.

LoRA (``model/lora.py``) moves an adapted layer's weight under
``.base_layer.`` and adds ``.lora_A.`` / ``.lora_B.`` adapters: ``base_name``
is the name a Hugging Face checkpoint has for such a base weight.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


# PEFT's names: the frozen weight of an adapted layer, and the adapters.
BASE_LAYER = ".base_layer."
ADAPTER_MARK = ".lora_"


def is_adapter(name: str) -> bool:
    return ADAPTER_MARK in f".{name}"


def base_name(name: str) -> str:
    """The name a Hugging Face checkpoint gives a (possibly LoRA-wrapped) base tensor."""
    return canonical(name).replace(BASE_LAYER, ".")


def base_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(Hugging Face name, parameter) of every parameter but the LoRA adapters, tied ones once."""
    for name, param in unique_parameters(model):
        if not is_adapter(name):
            yield base_name(name), param


def unique_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(canonical name, parameter), each shared (tied) parameter once under its first name."""
    for name, param in model.named_parameters():  # named_parameters already skips duplicates
        yield canonical(name), param
