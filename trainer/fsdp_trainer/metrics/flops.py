"""Model FLOPs per token and the peak FLOP/s of each GPU: the two halves of MFU.

Model FLOPs utilisation (MFU) = achieved model FLOP/s per device / the
device's dense peak FLOP/s for the training dtype. "Model" FLOPs count the
work the model needs, not what the hardware did: recomputation by activation
checkpointing is *not* counted, so MFU does not rise when you recompute.

FLOPs per token follow the PaLM paper (appendix B) as torchtitan implements
it, counted on the actual model (any architecture) rather than a formula::

    flops_per_token = 6 * N + 12 * num_layers * attention_width * seq_len

- ``6 * N``: every matmul parameter costs 2 FLOPs forward and 4 backward.
  ``N`` counts the parameters a token passes through in a matmul: all of
  them except lookup tables (the input embedding, learned position
  embeddings). With tied embeddings the table *is* the output projection, so
  it stays in ``N`` (torchtitan drops it, which undercounts tied models such
  as Llama 3.2). For mixture-of-experts, a token passes through
  ``num_experts_per_tok`` of the experts: expert parameters (those under a
  module named ``experts``) count by that fraction.
- Frozen weights (LoRA's base, ``spec.peft``) get no weight gradient: a
  frozen matmul parameter costs 2 FLOPs forward and 2 backward (the
  gradient of its input, which the adapters below it need), so
  ``6 * N`` becomes ``6 * N_trainable + 4 * N_frozen``; the adapters are
  trainable matmul parameters like any other.
- ``12 * L * W * S``: the attention score and value matmuls (QK^T and AV), 2
  FLOPs per multiply-add forward, twice that backward, per layer, where
  ``W = num_heads * head_dim`` (the hidden size for Llama, not for
  architectures with an explicit ``head_dim``). It uses the full sequence
  length (no causal halving, no sliding window), as PaLM and torchtitan do.

Peak numbers are NVIDIA datasheet figures for *dense* math (the datasheets
often print the 2:4-sparse number, twice as large). Override with the
``FSDP_PEAK_TFLOPS`` environment variable for a device the table lacks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from fsdp_api.contract import ENV_PEAK_TFLOPS
from fsdp_api.precision import compute_dtype
from torch import nn
from transformers import PreTrainedModel

PEAK_OVERRIDE_ENV = ENV_PEAK_TFLOPS
# Config keys that give the number of experts, as transformers' MoE configs spell it.
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class FlopsShape:
    """What FLOPs per token depend on."""

    matmul_params: int  # active per token (MoE: the routed fraction of the experts)
    num_layers: int
    attention_width: int  # num_heads * head_dim
    frozen_matmul_params: int = 0  # the part of matmul_params that is frozen (no weight gradient)

    def attention_flops_per_token(self, seq_len: int) -> int:
        return 12 * self.num_layers * self.attention_width * seq_len

    def flops_per_token(self, seq_len: int) -> int:
        """Training (forward + backward) model FLOPs per token; see the module docstring."""
        trainable = self.matmul_params - self.frozen_matmul_params
        return 6 * trainable + 4 * self.frozen_matmul_params + self.attention_flops_per_token(seq_len)


def _expert_fraction(config: Any) -> float:
    experts = next((getattr(config, k) for k in EXPERT_COUNT_KEYS if getattr(config, k, None)), None)
    active = getattr(config, "num_experts_per_tok", None)
    return active / experts if experts and active else 1.0


def shape_of(model: PreTrainedModel) -> FlopsShape:
    """The FLOPs shape of a transformers causal LM (works on the meta device)."""
    config = model.config.get_text_config()
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = model.get_output_embeddings()
    if head is not None:
        lookups.discard(id(head.weight))  # tied: the table is also the output matmul
    fraction = _expert_fraction(config)
    matmul = frozen = 0.0
    for name, param in model.named_parameters():  # tied parameters once
        if id(param) in lookups:
            continue
        share = fraction if ".experts." in f".{name}." else 1.0
        matmul += param.numel() * share
        if not param.requires_grad:
            frozen += param.numel() * share
    layers = getattr(config, "num_hidden_layers", 0)
    return FlopsShape(round(matmul), layers, _attention_width(config, layers), round(frozen))


def _layer_attention_width(config: Any) -> int:
    # A state-space model (mamba, rwkv) has no attention heads: no score/value term, only its matmuls.
    heads = getattr(config, "num_attention_heads", None) or 0
    return heads * (getattr(config, "head_dim", None) or config.hidden_size // heads) if heads else 0


def _attention_width(config: Any, layers: int) -> int:
    """heads x head_dim; for a config whose layers differ (Gemma 4's per-layer head_dim) the mean over layers.

    Such a config refuses to answer a per-layer attribute globally (an error, not a default).
    """
    per_layer = getattr(config, "per_layer_config", None)
    if per_layer is None or not layers:
        return _layer_attention_width(config)
    return round(sum(_layer_attention_width(per_layer[i]) for i in range(layers)) / layers)


@dataclass(frozen=True)
class PeakTFLOPs:
    """Dense peak TFLOP/s of one GPU: bf16, float8 (None: no float8 tensor cores) and TF32 tensor cores, FP32."""

    bf16: float
    tf32: float
    fp32: float
    fp8: float | None = None


# float8 (dense) only where the GPU has float8 tensor cores (Hopper, Ada, Blackwell):
# NVIDIA's datasheets give it at twice the bf16 figure, e.g. H100 SXM 3,958
# TFLOP/s with sparsity, 1,979 dense; Ampere (A100, A10/A10G) has none.
# Ordered: the first pattern that matches the NVML/torch device name wins, so
# specific variants (H100 NVL, H100 PCIe) come before the family name.
# Names as NVML reports them, e.g. "NVIDIA H100 80GB HBM3" (SXM5),
# "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA A10G".
PEAK_TABLE: tuple[tuple[str, str, PeakTFLOPs], ...] = (
    ("B200", r"\bB200\b", PeakTFLOPs(bf16=2250.0, tf32=1100.0, fp32=75.0, fp8=4500.0)),
    ("H200 NVL", r"\bH200 NVL\b", PeakTFLOPs(bf16=835.5, tf32=417.5, fp32=60.0, fp8=1671.0)),
    ("H200", r"\bH200\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9, fp8=1978.9)),
    ("GH200", r"\bGH200\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9, fp8=1978.9)),
    ("H100 NVL", r"\bH100 NVL\b", PeakTFLOPs(bf16=835.5, tf32=417.5, fp32=60.0, fp8=1671.0)),
    ("H100 PCIe", r"\bH100 PCIe\b", PeakTFLOPs(bf16=756.5, tf32=378.0, fp32=51.2, fp8=1513.0)),
    ("H100 SXM", r"\bH100\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9, fp8=1978.9)),
    ("H800", r"\bH800\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9, fp8=1978.9)),
    ("A100", r"\bA100\b", PeakTFLOPs(bf16=312.0, tf32=156.0, fp32=19.5)),
    ("A800", r"\bA800\b", PeakTFLOPs(bf16=312.0, tf32=156.0, fp32=19.5)),
    ("L40S", r"\bL40S\b", PeakTFLOPs(bf16=362.1, tf32=183.0, fp32=91.6, fp8=733.0)),
    ("L40", r"\bL40\b", PeakTFLOPs(bf16=181.0, tf32=90.5, fp32=90.5, fp8=362.0)),
    ("L4", r"\bL4\b", PeakTFLOPs(bf16=121.0, tf32=60.0, fp32=30.3, fp8=242.5)),
    # AWS's A10G (g5) has no datasheet of its own; it is an A10 variant, so the
    # A10's figures stand in for it.
    ("A10G", r"\bA10G\b", PeakTFLOPs(bf16=125.0, tf32=62.5, fp32=31.2)),
    ("A10", r"\bA10\b", PeakTFLOPs(bf16=125.0, tf32=62.5, fp32=31.2)),
)


def lookup_peak(device_name: str) -> tuple[str, PeakTFLOPs] | None:
    """The table row for a device name as NVML or torch reports it, or None."""
    for label, pattern, peak in PEAK_TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return label, peak
    return None


def peak_tflops(device_name: str | None, precision: str, *, tf32: bool = False) -> float:
    """Dense peak TFLOP/s of one device for the training precision; 0.0 when unknown.

    ``device_name`` is None on the CPU, whose peak we do not guess: MFU is then
    not reported. ``precision`` is the spec's ``bf16``, ``float8`` or ``fp32``; fp32
    matmuls run on TF32 tensor cores only when torch allows it (``tf32``).
    """
    override = os.environ.get(PEAK_OVERRIDE_ENV)
    if override:
        return float(override)
    if device_name is None:
        return 0.0
    row = lookup_peak(device_name)
    if row is None:
        return 0.0
    peak = row[1]
    if compute_dtype(precision) == "bf16":  # float8 too: its MFU is against the bf16 peak
        return peak.bf16
    return peak.tf32 if tf32 else peak.fp32


def float8_peak_tflops(device_name: str | None) -> float:
    """Dense float8 peak TFLOP/s of one device; 0.0 when unknown, on the CPU, or with FSDP_PEAK_TFLOPS set.

    The override names one peak (the one ``peak_tflops`` returns); a second,
    float8 MFU beside it would be a guess.
    """
    if device_name is None or os.environ.get(PEAK_OVERRIDE_ENV):
        return 0.0
    row = lookup_peak(device_name)
    if row is None:
        return 0.0
    return row[1].fp8 or 0.0


def mfu(tflops_per_device: float, peak: float) -> float | None:
    """Model FLOPs utilisation in 0..1, or None when the peak is unknown (CPU)."""
    if peak <= 0:
        return None
    return tflops_per_device / peak
