"""Configs whose layers differ (transformers' per_layer_config): the checks read each layer, never the global value."""

from __future__ import annotations

import pytest
from fsdp_trainer.model.layer_values import layer_values
from fsdp_trainer.parallel.tensor_parallel import _split_sizes

from tests.bench.scripts import load_bench_script


def _dots3_text() -> object:
    # A heterogeneous config from transformers itself: 3 layers, the last with half the heads.
    return load_bench_script("architecture_sweep").tiny_config("dots3_note_text")


def test_a_per_layer_attribute_is_read_layer_by_layer() -> None:
    config = _dots3_text()
    # What crashed the pod's check with a traceback: the global value is refused, not a default.
    with pytest.raises(RuntimeError, match="is a per-layer attribute"):
        config.num_attention_heads  # noqa: B018
    assert layer_values(config, "num_attention_heads") == [4, 4, 2]
    assert layer_values(config, "num_key_value_heads") == [4, 4, 2]
    # Tensor parallelism must divide every layer's heads, not one layer's.
    assert _split_sizes(config) == [
        ("num_attention_heads", 4),
        ("num_attention_heads", 2),
        ("num_key_value_heads", 4),
        ("num_key_value_heads", 2),
        ("intermediate_size", 128),
    ]


def test_a_config_whose_layers_agree_gives_the_same_value_for_each() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2)
    assert set(layer_values(config, "num_key_value_heads")) == {2}
    assert set(layer_values(config, "no_such_field")) == {None}
    assert _split_sizes(config) == [
        ("num_attention_heads", 8),
        ("num_key_value_heads", 2),
        ("intermediate_size", 11008),
    ]
