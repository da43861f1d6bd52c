"""The training precisions (``training.precision``) and the dtype each computes in.

``float8`` computes in bf16 like ``bf16`` (the same FSDP mixed-precision
policy, the same memory for activations), with the decoder blocks' matmuls
in float8 through torchao (``fsdp_trainer.parallel.float8``).
"""

from __future__ import annotations

from typing import Literal

Precision = Literal["bf16", "float8", "fp32"]
Float8Recipe = Literal["tensorwise", "rowwise"]
DEFAULT_FLOAT8_RECIPE: Float8Recipe = "tensorwise"
# float8 matmuls (torch._scaled_mm) take dimensions divisible by 16: the trainer converts only
# such projections, and the memory plan counts only those as float8.
FLOAT8_DIVISOR = 16


def float8_fits(in_features: int, out_features: int) -> bool:
    """Whether a Linear of this shape can run in float8 (the trainer converts it; the plan counts it)."""
    return in_features % FLOAT8_DIVISOR == 0 and out_features % FLOAT8_DIVISOR == 0


def gathers_in_float8(recipe: str, sharded: bool) -> bool:
    """Whether FSDP all-gathers the float8 weights as float8: torchao offers it for tensorwise scaling only."""
    return sharded and recipe == "tensorwise"


def compute_dtype(precision: str) -> Literal["bf16", "fp32"]:
    """The dtype of activations and of the gathered weights: fp32 only for ``fp32``."""
    return "fp32" if precision == "fp32" else "bf16"
