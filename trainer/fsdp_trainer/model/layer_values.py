"""A config attribute's value in every decoder layer, for configs whose layers differ.

transformers' heterogeneous configs (``per_layer_config``: Gemma 4, dots3) refuse
to answer a per-layer attribute globally: ``config.num_attention_heads`` raises
(``AmbiguousGlobalPerLayerAttributeError``) instead of picking a layer's. A check
that asks it globally crashed the pod's config check with a traceback.
"""

from __future__ import annotations

from typing import Any


def layer_values(config: Any, name: str) -> list[Any]:
    """``name`` of each layer (one value for a config whose layers agree); None where a layer has none."""
    per_layer = getattr(config, "per_layer_config", None)
    layers = getattr(config, "num_hidden_layers", None)
    if per_layer is not None and isinstance(layers, int) and layers > 0:
        return [getattr(per_layer[i], name, None) for i in range(layers)]
    return [getattr(config, name, None)]
