"""Model FLOPs per token and the peak FLOP/s of each GPU: the two halves of MFU.

Model FLOPs utilisation (MFU) = achieved model FLOP/s per device / the
device's dense peak FLOP/s for the training dtype. "Model" FLOPs count the
work the model needs, not what the hardware did: recomputation by activation
checkpointing is *not* counted, so MFU does not rise when you recompute.

FLOPs per token follow the PaLM paper (appendix B) as torchtitan implements
it::

    flops_per_token = 6 * N + 12 * num_layers * hidden_size * seq_len

- ``6 * N``: every matmul parameter costs 2 FLOPs forward and 4 backward.
  ``N`` counts the parameters that take part in a matmul: all of them except
  the input embedding table, which is a lookup. With tied embeddings that table
  *is* the output projection, so it stays in ``N`` (torchtitan drops it, which
  undercounts tied models such as Llama 3.2).
- ``12 * L * H * S``: the attention score and value matmuls (QK^T and AV), 2
  FLOPs per multiply-add forward, twice that backward, per layer. It uses the
  full sequence length (no causal halving), as PaLM and torchtitan do.

Peak numbers are NVIDIA datasheet figures for *dense* math (the datasheets
often print the 2:4-sparse number, twice as large). Override with the
``FSDP_PEAK_TFLOPS`` environment variable for a device the table lacks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from fsdp_api.contract import ENV_PEAK_TFLOPS
from fsdp_api.presets import ModelDims

PEAK_OVERRIDE_ENV = ENV_PEAK_TFLOPS


def matmul_params(dims: ModelDims, num_params: int | None = None) -> int:
    """Parameters that take part in a matmul: all but the input embedding lookup.

    ``num_params`` is the model's real count (the train loop passes it); by
    default the architecture's formula stands in for it.
    """
    total = dims.num_params() if num_params is None else num_params
    embedding_lookup = 0 if dims.tie_word_embeddings else dims.vocab_size * dims.hidden_size
    return total - embedding_lookup


def attention_flops_per_token(dims: ModelDims, seq_len: int) -> int:
    return 12 * dims.num_layers * dims.hidden_size * seq_len


def flops_per_token(dims: ModelDims, seq_len: int, num_params: int | None = None) -> int:
    """Training (forward + backward) model FLOPs per token; see the module docstring."""
    return 6 * matmul_params(dims, num_params) + attention_flops_per_token(dims, seq_len)


@dataclass(frozen=True)
class PeakTFLOPs:
    """Dense peak TFLOP/s of one GPU: bf16 and TF32 tensor cores, plain FP32."""

    bf16: float
    tf32: float
    fp32: float


# Ordered: the first pattern that matches the NVML/torch device name wins, so
# specific variants (H100 NVL, H100 PCIe) come before the family name.
# Names as NVML reports them, e.g. "NVIDIA H100 80GB HBM3" (SXM5),
# "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA A10G".
PEAK_TABLE: tuple[tuple[str, str, PeakTFLOPs], ...] = (
    ("B200", r"\bB200\b", PeakTFLOPs(bf16=2250.0, tf32=1100.0, fp32=75.0)),
    ("H200 NVL", r"\bH200 NVL\b", PeakTFLOPs(bf16=835.5, tf32=417.5, fp32=60.0)),
    ("H200", r"\bH200\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9)),
    ("GH200", r"\bGH200\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9)),
    ("H100 NVL", r"\bH100 NVL\b", PeakTFLOPs(bf16=835.5, tf32=417.5, fp32=60.0)),
    ("H100 PCIe", r"\bH100 PCIe\b", PeakTFLOPs(bf16=756.5, tf32=378.0, fp32=51.2)),
    ("H100 SXM", r"\bH100\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9)),
    ("H800", r"\bH800\b", PeakTFLOPs(bf16=989.4, tf32=494.7, fp32=66.9)),
    ("A100", r"\bA100\b", PeakTFLOPs(bf16=312.0, tf32=156.0, fp32=19.5)),
    ("A800", r"\bA800\b", PeakTFLOPs(bf16=312.0, tf32=156.0, fp32=19.5)),
    ("L40S", r"\bL40S\b", PeakTFLOPs(bf16=362.1, tf32=183.0, fp32=91.6)),
    ("L40", r"\bL40\b", PeakTFLOPs(bf16=181.0, tf32=90.5, fp32=90.5)),
    ("L4", r"\bL4\b", PeakTFLOPs(bf16=121.0, tf32=60.0, fp32=30.3)),
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
    not reported. ``precision`` is the spec's ``bf16`` or ``fp32``; fp32
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
    if precision == "bf16":
        return peak.bf16
    return peak.tf32 if tf32 else peak.fp32


def mfu(tflops_per_device: float, peak: float) -> float | None:
    """Model FLOPs utilisation in 0..1, or None when the peak is unknown (CPU)."""
    if peak <= 0:
        return None
    return tflops_per_device / peak
