"""What an architecture does to its head's output before the loss, read from its config.

Each entry names the config attribute transformers' modeling code applies
after ``lm_head`` (read in transformers 5.23's ``modeling_*.py``): the
Gemma family, PaliGemma, T5Gemma and VaultGemma soft-cap with
``final_logit_softcapping``, RecurrentGemma with ``logits_soft_cap``;
Cohere multiplies by ``logit_scale``, Muse Spark by ``output_multiplier``,
Falcon-H1 by ``lm_head_multiplier``; the Granite family divides by
``logits_scaling`` while HyperCLOVA X multiplies by it. A model that does
something else is caught by the start-up check in ``head.py`` and trains on
full logits.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from .chunked import LogitTransform

_SOFTCAPS = ("final_logit_softcapping", "logits_soft_cap")
_SCALES: dict[str, Callable[[float, float], float]] = {
    "logit_scale": operator.mul,
    "output_multiplier": operator.mul,
    "lm_head_multiplier": operator.mul,
    "logits_scaling": operator.truediv,
}
# The same attribute name, the other way round.
_BY_MODEL_TYPE: dict[str, dict[str, Callable[[float, float], float]]] = {
    "hyperclovax": {"logits_scaling": operator.mul},
    "hyperclovax_vision_v2": {"logits_scaling": operator.mul},
}


def _number(config: Any, name: str) -> float | None:
    value = getattr(config, name, None)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value else None


def logit_transform(config: Any) -> LogitTransform:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    ops = {**_SCALES, **_BY_MODEL_TYPE.get(getattr(config, "model_type", ""), {})}
    scale = 1.0
    for name, op in ops.items():
        value = _number(text, name)
        if value is not None:
            scale = op(scale, value)
    cap = next((c for c in (_number(text, n) for n in _SOFTCAPS) if c), None)
    return LogitTransform(scale=scale, cap=cap)
