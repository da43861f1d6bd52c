"""Tensor parallelism from the model's own transformers plan (``base_model_tp_plan``).

transformers declares, per architecture, how a decoder block splits over
tensor-parallel ranks: ``colwise`` for the projections into attention heads
and the MLP's inner width (each rank computes whole heads and a slice of the
MLP), ``rowwise`` for the projections back to the residual stream (each rank
multiplies its slice and one all-reduce sums them), and the variants for
fused projections and per-head norms (``tp_styles.py``). Applying that plan
with torch's own parallel styles works for any model that declares one,
because transformers' attention reshapes its projections with ``-1`` heads:
a rank with half the heads computes on half. The
embedding, norms and output head stay whole on every tensor-parallel rank
(FSDP shards them over the data-parallel ranks), so the residual stream
between blocks is an ordinary tensor, the loss (chunked or full) is unchanged
and the HF export needs nothing new.

The plan goes on the meta model before activation checkpointing, compile and
``fully_shard`` (torchtitan's order), so FSDP shards each tensor-parallel
shard further over the data-parallel ranks (2-D DTensors), DCP reshards them
to any other split on resume, and the random init and the pretrained loader
write each rank's piece through the same slices as without it.

The MoE styles of transformers' plans (packed or expert-parallel expert
weights) are refused at the config check, naming the architecture and the
styles, rather than applied wrongly.
"""

from __future__ import annotations

import logging

import transformers
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module
from transformers import PreTrainedModel

from ..model.layer_values import layer_values
from .tp_styles import STYLES

log = logging.getLogger(__name__)


def tp_plan(model: nn.Module) -> dict[str, str]:
    """The architecture's plan: module pattern (relative to the base model) -> style; empty when it has none."""
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None) if config is not None else None
    return dict(plan or {})


def _split_sizes(config: object) -> list[tuple[str, int]]:
    """The sizes a tensor-parallel degree must divide: heads, key-value heads and the MLP width (of every layer)."""
    heads = layer_values(config, "num_attention_heads")
    kv = [k or h for k, h in zip(layer_values(config, "num_key_value_heads"), heads, strict=True)]
    sizes = {"num_attention_heads": heads, "num_key_value_heads": kv}
    sizes["intermediate_size"] = layer_values(config, "intermediate_size")
    return [(k, v) for k, values in sizes.items() for v in dict.fromkeys(values) if isinstance(v, int)]


def tensor_parallel_errors(model: PreTrainedModel, degree: int) -> list[str]:
    """Why ``model`` cannot be split over ``degree`` tensor-parallel ranks (one line each); empty when it can."""
    if degree == 1:
        return []
    name = type(model).__name__
    plan = tp_plan(model)
    if not plan:
        return [
            f"parallelism.tensor: {name} declares no tensor-parallel plan in transformers {transformers.__version__} "
            "(its config's base_model_tp_plan is empty), so its layers cannot be split; use parallelism.tensor: 1"
        ]
    other = sorted({style for style in plan.values() if style not in STYLES})
    if other:
        return [
            f"parallelism.tensor: {name}'s tensor-parallel plan uses the styles {', '.join(other)}, which this "
            f"trainer does not apply (it applies {', '.join(STYLES)}); use parallelism.tensor: 1"
        ]
    config = model.config.get_text_config()
    return [
        f"parallelism.tensor: {degree} does not divide {name}'s {key} ({size}): every tensor-parallel rank "
        "computes whole heads and an equal slice of the MLP"
        for key, size in _split_sizes(config)
        if size % degree
    ]


def apply_tensor_parallel(model: PreTrainedModel, mesh: DeviceMesh) -> int:
    """Split the base model's projections over ``mesh`` (the tensor-parallel dimension); returns how many."""
    base = model.base_model
    plan = tp_plan(model)
    parallelize_module(base, mesh, {pattern: STYLES[style]() for pattern, style in plan.items()})
    split = sum(1 for _, m in base.named_modules() if _is_split(m))
    used = sorted(set(plan.values()))
    log.info(
        "tensor parallel: %d projections split over %d ranks (%s: %s)",
        split,
        mesh.size(),
        type(model).__name__,
        ", ".join(used),
    )
    return split


def _is_split(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    weight = getattr(module, "weight", None)
    return isinstance(module, nn.Linear) and isinstance(weight, DTensor)
