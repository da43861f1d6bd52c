"""The Llama presets as transformers ``LlamaConfig``s (``model.preset`` plus overrides).

A preset is only a shorthand for a config: the model is then built,
sharded and initialised like any other architecture (``architecture.py``).
"""

from __future__ import annotations

from fsdp_api.presets import ModelDims
from fsdp_api.spec import ModelSpec
from transformers import LlamaConfig

INIT_STD = 0.02
RMS_NORM_EPS = 1e-5
# Llama 3.x context extension ("llama3" RoPE scaling), per the model cards:
# 3.1 stretches 8k to 128k (factor 8), 3.2 (1B/3B) uses factor 32.
ROPE_SCALING_FACTOR = {"llama3.2": 32.0, "llama3.1": 8.0}


def rope_parameters(preset: str, dims: ModelDims) -> dict[str, float | str | int]:
    if not dims.rope_scaling:
        return {"rope_type": "default", "rope_theta": dims.rope_theta}
    factor = next((f for prefix, f in ROPE_SCALING_FACTOR.items() if preset.startswith(prefix)), 8.0)
    return {
        "rope_type": "llama3",
        "rope_theta": dims.rope_theta,
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def llama_config(
    spec: ModelSpec,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> LlamaConfig:
    """The transformers config for a preset plus overrides."""
    dims = spec.dims()
    assert spec.preset is not None and dims is not None, "a Llama config is made for model.preset only"
    # attn_implementation: transformers' config dataclasses take the PreTrainedConfig keywords at runtime
    # (their __post_init__ pops them), but the __init__ that type checkers see lists the fields only.
    return LlamaConfig(  # type: ignore[call-arg]
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_heads,
        num_key_value_heads=dims.num_key_value_heads,
        head_dim=dims.head_dim,
        max_position_embeddings=dims.max_seq_len,
        rms_norm_eps=RMS_NORM_EPS,
        rope_parameters=rope_parameters(spec.preset, dims),
        tie_word_embeddings=dims.tie_word_embeddings,
        initializer_range=INIT_STD,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        use_cache=False,
        attn_implementation="sdpa",
    )
