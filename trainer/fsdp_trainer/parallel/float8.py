"""float8 matmuls for the decoder blocks (``training.precision: float8``), through torchao.

Which Linear layers convert is decided here for any architecture, not per
model family: a layer inside a decoder block whose both dimensions divide
by 16 (what float8 matmuls take), except routers (a mixture-of-experts
gate picks experts: its few outputs need the precision), LoRA's adapter
matrices (with ``spec.peft`` the frozen base layers convert, the adapters
train in bf16) and never the output head (the loss's logits). Everything else (embeddings, norms, the
head, experts stored as 3-D parameters) stays in bf16. The conversion
swaps the module class and keeps parameter names, so checkpoints and the
Hugging Face export are those of a bf16 run.

On the CPU torchao emulates the float8 matmuls (same casts and scales,
matmul in high precision): what the tests use; admission refuses float8
for CPU-only jobs and GPUs without float8 tensor cores.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch
from fsdp_api.precision import FLOAT8_DIVISOR, float8_fits, gathers_in_float8
from torch import nn

from ..model.architecture import decoder_units
from ..model.experts import experts_modules

log = logging.getLogger(__name__)

ROUTER_NAMES = frozenset({"gate", "router", "gating"})
# What the log says of a mixture of experts' experts: torchao's float8 grouped GEMM for 3-D expert
# weights is not applied (yet), so they compute in bf16 beside the converted projections.
EXPERTS_KEPT = "experts modules' 3-D weights (float8 converts Linear layers only)"


@dataclass
class Float8Report:
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why

    @property
    def kept_linears(self) -> int:
        """The Linear layers left in bf16 (the experts' 3-D weights are not Linear layers)."""
        return sum(1 for why in self.skipped.values() if why != EXPERTS_KEPT)

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for why in self.skipped.values():
            reasons[why] = reasons.get(why, 0) + 1
        kept = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        return f"{len(self.converted)} Linear layers in float8" + (f"; kept in bf16: {kept}" if kept else "")


def _why_not(name: str, module: nn.Linear) -> str | None:
    if ".lora_" in f".{name}":  # PEFT's adapter matrices: tiny, and the only weights that train
        return "LoRA adapter"
    if name.rsplit(".", 1)[-1] in ROUTER_NAMES or ".router." in f".{name}.":
        return "router"
    if not float8_fits(module.in_features, module.out_features):
        return f"dimension not divisible by {FLOAT8_DIVISOR}"
    return None


def float8_plan(model: nn.Module) -> Float8Report:
    """Which Linear layers of the decoder blocks convert, and why the others do not."""
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if output_embeddings is not None else None
    report = Float8Report()
    in_blocks = {id(m) for unit in decoder_units(model) for m in unit.module.modules()}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if module is head:
            why: str | None = "output head"
        else:
            why = _why_not(name, module) if id(module) in in_blocks else "outside the decoder blocks"
        if why is None:
            report.converted.append(name)
        else:
            report.skipped[name] = why
    for name in experts_modules(model):
        report.skipped[name] = EXPERTS_KEPT
    return report


def apply_float8(model: nn.Module, recipe: str, device: torch.device, *, fsdp: bool) -> Float8Report:
    """Convert in place (on the meta model, before checkpointing, compile and FSDP wrap it)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:  # the trainer image installs it; a hand-made environment may not
        raise RuntimeError(f"training.precision float8 needs torchao ({e})") from None
    report = float8_plan(model)
    chosen = set(report.converted)
    config = Float8LinearConfig.from_recipe_name(recipe)
    # tensorwise scales let FSDP all-gather the weights in float8 (half the bytes of bf16);
    # the CPU has no float8 matmul, so torchao emulates it there.
    config = dataclasses.replace(
        config, enable_fsdp_float8_all_gather=gathers_in_float8(recipe, fsdp), emulate=device.type != "cuda"
    )
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _m, name: name in chosen)
    log.info("float8 (%s recipe%s): %s", recipe, ", emulated on the CPU" if config.emulate else "", report.summary())
    return report
