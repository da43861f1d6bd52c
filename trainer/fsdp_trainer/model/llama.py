"""The Llama model: built on the meta device, then materialised shard by shard.

Nothing is allocated until the model is sharded: ``build_meta_model`` creates
a ``transformers.LlamaForCausalLM`` whose tensors are shapes only, FSDP2 shards
that, ``to_empty`` allocates each rank's shards, and ``init_weights`` fills
them. Initialisation draws each parameter's full tensor from a generator
seeded by (seed, parameter name), one tensor at a time, and keeps this rank's
piece: the result is the same for any world size or sharding strategy, which
is what makes a sharded run comparable with a single-process one.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed.tensor
from fsdp_api.presets import ModelDims
from fsdp_api.spec import ModelSpec
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from .param_names import unique_parameters
from .shards import copy_full_into

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
    return LlamaConfig(
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


def build_meta_model(config: LlamaConfig) -> LlamaForCausalLM:
    """The model with shapes but no storage."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_std(name: str, num_layers: int) -> float | None:
    """Standard deviation for a weight; None for RMSNorm weights (ones).

    The residual-stream output projections (attention o_proj and MLP
    down_proj) are scaled by 1/sqrt(2 * layers), as in GPT-2, so the residual
    stream's variance does not grow with depth.
    """
    if name.endswith("norm.weight"):
        return None
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return INIT_STD / math.sqrt(2 * num_layers)
    return INIT_STD


@torch.no_grad()
def init_weights(model: LlamaForCausalLM, seed: int, device: torch.device) -> None:
    """Fill freshly materialised (``to_empty``) parameters and recompute the buffers."""
    num_layers = model.config.num_hidden_layers
    for name, param in unique_parameters(model):
        std = init_std(name, num_layers)
        if std is None:
            full = torch.ones(param.shape, device=device, dtype=torch.float32)
        else:
            gen = torch.Generator(device=device).manual_seed(_seed_for(seed, name))
            full = torch.empty(param.shape, device=device, dtype=torch.float32).normal_(0.0, std, generator=gen)
        copy_full_into(param, full)
        del full
    reset_buffers(model)
    check_tied(model)


@torch.no_grad()
def reset_buffers(model: nn.Module) -> None:
    """Recompute non-persistent buffers, which ``to_empty`` leaves as garbage.

    The rotary embedding's ``inv_freq`` is the only such buffer in Llama; it is
    not in checkpoints (non-persistent), so it is recomputed by building a
    fresh rotary module on the CPU with transformers' own code and copying.
    """
    for module in model.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "config"):
            with torch.device("cpu"):
                fresh = type(module)(module.config)
            for name, buf in fresh.named_buffers(recurse=False):
                getattr(module, name).copy_(buf)
            module.attention_scaling = fresh.attention_scaling


def _is_tied(model: LlamaForCausalLM) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def materialize(model: LlamaForCausalLM, device: torch.device | str) -> None:
    """Allocate (uninitialised) storage for the meta model's shards, keeping tied weights tied.

    ``to_empty`` on a plain module swaps in new Parameter objects, which
    unties ``lm_head`` from the embedding; FSDP2 keeps the shared parameter
    as one. Re-tie the plain case, before init so both names get one tensor.
    """
    model.to_empty(device=device)
    if model.config.tie_word_embeddings and not _is_tied(model):
        if isinstance(model.lm_head.weight, torch.distributed.tensor.DTensor):
            raise RuntimeError("FSDP untied lm_head.weight from model.embed_tokens.weight")
        model.lm_head.weight = model.model.embed_tokens.weight


def check_tied(model: LlamaForCausalLM) -> None:
    """Tied embeddings must still share one parameter after materialisation."""
    if model.config.tie_word_embeddings and not _is_tied(model):
        raise RuntimeError("lm_head.weight is no longer tied to model.embed_tokens.weight after materialisation")


def count_parameters(model: nn.Module) -> int:
    """Parameters of the full (unsharded) model, tied ones once."""
    return sum(p.numel() for _, p in unique_parameters(model))
