"""Tiny random checkpoints of several architectures, built offline with transformers.

Each is what a user would bring as ``model.pretrained``: a directory written by
``save_pretrained`` (config.json + safetensors, in the on-disk layout
transformers uses, e.g. Mixtral's per-expert tensors) plus a tokenizer. The
set covers what breaks a Llama-only trainer: attention biases (Qwen2),
sliding windows (Mistral, Gemma 2), zero-centred norms and explicit head_dim
(Gemma 2), Conv1D and learned positions (GPT-2), mixture-of-experts with a
converted checkpoint layout (Mixtral), tied and untied embeddings, state-space
layers with buffers computed at construction (Falcon-H1).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 256  # covers the harness's word tokenizer (204 tokens)
_COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "intermediate_size": 48, "num_key_value_heads": 2, "tie_word_embeddings": False},
    "qwen2": {**_COMMON, "intermediate_size": 48, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "mistral": {**_COMMON, "intermediate_size": 48, "num_key_value_heads": 2, "sliding_window": 16},
    "gemma2": {**_COMMON, "intermediate_size": 48, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 16},
    # Their tensor-parallel plans go beyond colwise/rowwise: per-head q/k norms (Qwen3, Gemma 3)
    # and fused qkv and gate/up projections whose outputs are gathered (Phi-3).
    "qwen3": {**_COMMON, "intermediate_size": 48, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "gemma3_text": {
        **_COMMON,
        "intermediate_size": 48,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "phi3": {
        **_COMMON,
        "intermediate_size": 48,
        "num_key_value_heads": 2,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        # Phi-3's defaults are ids of its own 32k vocabulary.
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
    },
    # GPT-2 trains with dropout by default: each rank would drop different
    # units, so a sharded run could not match a single process.
    "gpt2": {
        "vocab_size": VOCAB,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "mixtral": {
        **_COMMON,
        "intermediate_size": 48,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    # The expert-parallel set (tests/trainer/parallel/test_expert_parallel.py): each declares
    # transformers' expert-parallel plan. Qwen2-MoE has a gated shared expert beside the routed
    # ones; DeepSeek V3 a shared expert, a dense first layer and group-limited routing.
    "qwen3_moe": {
        **_COMMON,
        "intermediate_size": 48,
        "moe_intermediate_size": 24,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    "olmoe": {**_COMMON, "intermediate_size": 24, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {
        **_COMMON,
        "intermediate_size": 48,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 48,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    "deepseek_v3": {
        **_COMMON,
        "intermediate_size": 48,
        "moe_intermediate_size": 24,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
    },
    # A Mamba-2/attention hybrid whose model writes a buffer into every layer
    # (the muP vector) from its own _init_weights.
    "falcon_h1": {
        **_COMMON,
        "intermediate_size": 48,
        "num_key_value_heads": 2,
        "mamba_d_ssm": 32,
        "mamba_n_heads": 4,
    },
}


def build_checkpoint(model_type: str, path: Path, tokenizer: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """A random ``model_type`` model saved with its tokenizer (std 0.1: logits far from uniform)."""
    # Token ids of the harness tokenizer (<bos>, <eos>, <pad>), not the architecture defaults.
    kwargs = {
        **ARCHITECTURES[model_type],
        "initializer_range": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        **overrides,
    }
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    for file in tokenizer.iterdir():
        shutil.copy(file, path / file.name)
    return path
