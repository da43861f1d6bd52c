"""training.kernels: which kernel set applies, why not, and Liger's real patches on a tiny model.

Liger's Triton kernels run on CUDA only: here the patching is checked (the
real library's instance patching, on a CPU-built model that is never run);
their speed and the training's numbers with them are for a GPU.
"""

from __future__ import annotations

import importlib.util

import pytest
import transformers.models.llama.modeling_llama as modeling_llama
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.model.kernels import KernelReport, apply_kernels
from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
from liger_kernel.transformers.rms_norm import LigerRMSNorm
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from tests.trainer.model.architectures import ARCHITECTURES


def tiny(model_type: str) -> PreTrainedModel:
    config = AutoConfig.for_model(model_type, **ARCHITECTURES[model_type])
    return AutoModelForCausalLM.from_config(config)


def test_liger_covers_these_of_the_architecture_sweep() -> None:
    covered = sorted(t for t in ARCHITECTURES if t in MODEL_TYPE_TO_APPLY_LIGER_FN)
    # Liger 0.8.5 has no patch for GPT-2, nor for the OLMoE and Qwen2-MoE of the expert-parallel set.
    assert sorted(set(ARCHITECTURES) - set(covered)) == ["gpt2", "olmoe", "qwen2_moe"], covered


def test_on_a_gpu_a_covered_model_gets_ligers_norms_and_mlps(monkeypatch: pytest.MonkeyPatch) -> None:
    # Liger also replaces the architecture's classes and rotary function module-wide (as the trainer
    # process wants: its reference model too): every name of the module is put back after the test.
    for name, value in list(vars(modeling_llama).items()):
        if not name.startswith("__"):
            monkeypatch.setattr(modeling_llama, name, value)
    model = tiny("llama")
    own_mlp = type(model.model.layers[0].mlp).forward
    report = apply_kernels("auto", model, "cuda", 1)
    assert report == KernelReport("liger", "Liger's RMSNorm, rotary and gated-MLP kernels for llama")
    assert report.line() == "training.kernels: liger (Liger's RMSNorm, rotary and gated-MLP kernels for llama)"
    assert model.model.norm.forward.__func__ is LigerRMSNorm.forward
    assert all(layer.input_layernorm.forward.__func__ is LigerRMSNorm.forward for layer in model.model.layers)
    assert model.model.layers[0].mlp.forward.__func__ is not own_mlp
    assert modeling_llama.apply_rotary_pos_emb.__module__.startswith("liger_kernel")


@pytest.mark.parametrize(
    ("model_type", "device", "tensor", "reason"),
    [
        ("llama", "cpu", 1, "cpu ranks: its Triton kernels run on CUDA only"),
        ("llama", "cuda", 2, "parallelism.tensor > 1: its kernels take local tensors, not DTensors"),
        ("gpt2", "cuda", 1, "it has no kernels for model type gpt2"),
    ],
)
def test_where_liger_cannot_apply_auto_keeps_the_models_modules_and_liger_is_one_line(
    model_type: str, device: str, tensor: int, reason: str
) -> None:
    model = tiny(model_type)
    before = [m.forward for m in model.modules()]
    report = apply_kernels("auto", model, device, tensor)
    assert report.line() == f"training.kernels: none (auto: liger: {reason})"
    assert [m.forward for m in model.modules()] == before
    with pytest.raises(ConfigError) as refused:
        apply_kernels("liger", model, device, tensor)
    assert refused.value.lines == [f"training.kernels: liger cannot apply: {reason}; use auto or none"]


def test_an_image_without_liger_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a)
    )
    report = apply_kernels("auto", tiny("llama"), "cuda", 1)
    assert report.line() == "training.kernels: none (auto: liger: liger_kernel is not installed in this image)"


def test_none_patches_nothing() -> None:
    model = tiny("llama")
    assert apply_kernels("none", model, "cuda", 1) == KernelReport(None, "training.kernels none")
    assert model.model.norm.forward.__func__ is not LigerRMSNorm.forward
