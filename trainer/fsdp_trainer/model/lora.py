"""LoRA adapters (``spec.peft``), put into the meta model before FSDP2 shards it.

PEFT's ``inject_adapter_in_model`` replaces each target ``Linear`` (or GPT-2's
``Conv1D``) by a LoRA layer that keeps the original as ``base_layer`` and adds
``lora_A``/``lora_B``. It works on the meta model: the adapters are created
with shapes only, so FSDP2 shards base weights and adapters of a decoder layer
as one group, and no rank ever holds the full model. ``get_peft_model`` is not
used: its ``PeftModel`` wrapper adds a ``base_model.model.`` prefix to every
name, which the trainer's checkpoints, pretrained loading and export would
then all have to strip.

The base weights are frozen (``requires_grad=False``): they get no gradient,
the optimizer never sees them and checkpoints leave them out. Parameter names
carry PEFT's ``.base_layer.`` for the frozen weight and ``.lora_A.default.`` /
``.lora_B.default.`` for the adapters; ``param_names.base_name`` maps the
former back to the name a Hugging Face checkpoint uses.

Targets are found from the model, not from a table per architecture: by
default every ``Linear``/``Conv1D`` inside the decoder layers (the model's
``_no_split_modules`` blocks, see ``architecture.decoder_units``), which is
what PEFT's ``all-linear`` selects on Llama, Qwen2, Mistral, Gemma 2 and
GPT-2, minus a mixture-of-experts router (a ``Linear`` beside an ``experts``
module): adapting it would change which experts see each token.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from fsdp_api.spec import PeftSpec
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..errors import ConfigError
from .architecture import decoder_units
from .init import seed_for
from .param_names import canonical, is_adapter
from .shards import copy_full_into

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

# PEFT's adapter name when none is given; it appears in parameter names.
ADAPTER = "default"
ADAPTABLE = (nn.Linear, Conv1D)


def _modules_in_units(model: nn.Module) -> dict[str, nn.Module]:
    """Every module inside the decoder layers, by canonical full name."""
    unit_ids = {id(unit.module) for unit in decoder_units(model)}
    out: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if id(module) in unit_ids:
            for sub, child in module.named_modules():
                if sub:
                    out[canonical(f"{name}.{sub}")] = child
    return out


def _routers(model: nn.Module) -> set[str]:
    """Linear layers that sit beside an ``experts`` module: mixture-of-experts routers."""
    found = set()
    for name, module in model.named_modules():
        children = dict(module.named_children())
        if "experts" in children:
            for child_name, child in children.items():
                if isinstance(child, ADAPTABLE):
                    found.add(canonical(f"{name}.{child_name}" if name else child_name))
    return found


def _short_names(names: list[str]) -> str:
    shorts = sorted({n.rsplit(".", 1)[-1] for n in names})
    return ", ".join(shorts) or "none"


def find_targets(model: nn.Module, spec: PeftSpec) -> list[str]:
    """Full names of the modules to adapt; ConfigError naming each target that matches nothing usable."""
    inside = _modules_in_units(model)
    routers = _routers(model)
    linear = [n for n, m in inside.items() if isinstance(m, ADAPTABLE) and n not in routers]
    if spec.target_modules is None:
        if not linear:
            raise ConfigError([f"peft: {type(model).__name__} has no Linear layers inside its decoder layers to adapt"])
        return sorted(linear)
    errors, targets = [], set()
    everything = {canonical(n) for n, _ in model.named_modules() if n}
    for entry in spec.target_modules:
        matched = [n for n in inside if n == entry or n.endswith(f".{entry}")]
        usable = [n for n in matched if n in linear]
        if usable:
            targets.update(usable)
            continue
        outside = [n for n in everything if (n == entry or n.endswith(f".{entry}")) and n not in inside]
        if matched:
            kinds = sorted({type(inside[n]).__name__ for n in matched})
            why = f"matches {matched[0]} ({', '.join(kinds)}), not a Linear layer"
            if any(n in routers for n in matched):
                why = f"matches {matched[0]}, a mixture-of-experts router"
        elif outside:
            why = f"matches {sorted(outside)[0]}, outside the decoder layers (only modules inside them are adapted)"
        else:
            why = f"matches no module of {type(model).__name__}"
        errors.append(f"peft.targetModules: {entry} {why}; its decoder layers' Linear layers: {_short_names(linear)}")
    if errors:
        raise ConfigError(errors)
    return sorted(targets)


def lora_config(spec: PeftSpec, targets: list[str], *, fan_in_fan_out: bool, base: str | None = None) -> Any:
    """PEFT's ``LoraConfig`` for the spec (also what the exported adapter_config.json says)."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec.rank,
        # peft annotates lora_alpha an int, but scales by alpha / r: a fractional alpha is what the spec allows.
        lora_alpha=spec.effective_alpha(),  # type: ignore[arg-type]
        lora_dropout=spec.dropout,
        target_modules=list(targets),
        fan_in_fan_out=fan_in_fan_out,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
    )


def uses_conv1d(model: nn.Module, targets: list[str]) -> bool:
    """GPT-2's Conv1D stores weights transposed (in x out): PEFT must know (``fan_in_fan_out``)."""
    modules = {canonical(n): m for n, m in model.named_modules()}
    return any(isinstance(modules[t], Conv1D) for t in targets)


def apply_lora(model: nn.Module, spec: PeftSpec) -> list[str]:
    """Put adapters on the target modules and freeze everything else; returns the targets."""
    from peft import inject_adapter_in_model

    targets = find_targets(model, spec)
    config = lora_config(spec, targets, fan_in_fan_out=uses_conv1d(model, targets))
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad = is_adapter(name)
    return targets


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoraLayer]]:
    """(canonical name, PEFT LoRA layer) of every adapted module."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield canonical(name), module


@torch.no_grad()
def init_adapters(model: nn.Module, seed: int, device: torch.device) -> None:
    """PEFT's default LoRA init (A Kaiming-uniform, B zero), drawn whole per layer and sharded.

    The same init as ``LoraLayer.reset_lora_parameters`` with
    ``init_lora_weights=True`` (peft/tuners/lora/layer.py), but on the full
    tensor under a seed of (seed, layer name) and then cut to this rank's
    piece, so every world size and sharding strategy starts from the same
    adapters. B = 0 makes the adapted model start equal to the base.
    """
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for name, layer in lora_layers(model):
            a = layer.lora_A[ADAPTER].weight
            b = layer.lora_B[ADAPTER].weight
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)  # the adapter's Linear weights
            torch.manual_seed(seed_for(seed, f"lora:{name}"))
            full_a = torch.empty(a.shape, device=device, dtype=torch.float32)
            nn.init.kaiming_uniform_(full_a, a=math.sqrt(5))
            copy_full_into(a, full_a)
            copy_full_into(b, torch.zeros(b.shape, device=device, dtype=torch.float32))


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_summary(adapted: list[str], trainable: int, params: int) -> str:
    """The start-up line's note on LoRA: trainable parameters and their share ("" without LoRA)."""
    if not adapted:
        return ""
    share = 100 * trainable / max(1, params)
    return f" ({trainable / 1e6:.2f}M trainable, {share:.2f}%: LoRA on {len(adapted)} modules)"
