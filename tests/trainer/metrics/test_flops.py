"""FLOPs per token, the peak table and MFU: the numbers behind fsdp_train_tflops/mfu_ratio."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
import torch
from fsdp_api import PRESETS
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.metrics import MetricsProcessor, StepStats
from fsdp_trainer.metrics.flops import (
    PEAK_OVERRIDE_ENV,
    FlopsShape,
    float8_peak_tflops,
    lookup_peak,
    mfu,
    peak_tflops,
    shape_of,
)
from fsdp_trainer.metrics.logline import MFU_PATTERN
from fsdp_trainer.model.architecture import build_meta_model
from fsdp_trainer.model.llama import llama_config


def _shape(preset: str) -> FlopsShape:
    """FLOPs shape of the preset's real (meta-device) transformers model."""
    from fsdp_api.spec import ModelSpec

    return shape_of(build_meta_model(llama_config(ModelSpec(preset=preset))))


def test_llama32_1b_at_2048_counts_the_tied_head_once() -> None:
    # 1.24B parameters, embeddings tied: the table is the output projection.
    shape = _shape("llama3.2-1b")
    assert PRESETS["llama3.2-1b"].num_params() == 1_235_814_400
    assert shape.matmul_params == 1_235_814_400
    assert shape.attention_flops_per_token(2048) == 12 * 16 * 2048 * 2048 == 805_306_368
    assert shape.flops_per_token(2048) == 6 * 1_235_814_400 + 805_306_368 == 8_220_192_768


def test_untied_model_excludes_the_embedding_lookup() -> None:
    shape = _shape("llama3.1-8b")
    assert PRESETS["llama3.1-8b"].num_params() == 8_030_261_248
    assert shape.matmul_params == 8_030_261_248 - 128_256 * 4096
    assert shape.flops_per_token(8192) == 6 * 7_504_924_672 + 12 * 32 * 4096 * 8192


def test_learned_positions_are_a_lookup_and_experts_count_by_routed_fraction() -> None:
    from transformers import AutoConfig

    gpt2 = build_meta_model(
        AutoConfig.for_model("gpt2", vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )
    total = sum(p.numel() for p in gpt2.parameters())
    # Tied head: the token table stays (it is the output matmul); the position table is a lookup.
    assert shape_of(gpt2).matmul_params == total - 64 * 32
    moe_config = AutoConfig.for_model(
        "mixtral",
        vocab_size=256,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=1,
        tie_word_embeddings=False,
    )
    moe = build_meta_model(moe_config)
    experts = sum(p.numel() for n, p in moe.named_parameters() if ".experts." in n)
    dense = sum(p.numel() for n, p in moe.named_parameters() if ".experts." not in n) - 256 * 32
    assert experts == 2 * 4 * 3 * 32 * 48  # layers x experts x (gate, up, down) x hidden x intermediate
    assert shape_of(moe).matmul_params == dense + experts // 4  # one expert of four per token


def test_explicit_head_dim_sets_the_attention_width() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "qwen3", vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    assert shape_of(build_meta_model(config)).attention_width == 4 * 16


def test_a_per_layer_head_dim_gives_the_mean_attention_width_over_layers() -> None:
    """Gemma 4's head_dim differs per layer and its config raises on a global read: the trainer stopped
    at start with AmbiguousGlobalPerLayerAttributeError (the architecture sweep)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma4_unified_text", vocab_size=256, hidden_size=64, intermediate_size=64)
    with pytest.raises(RuntimeError, match="'head_dim' is a per-layer attribute"):
        _ = config.head_dim
    dims = [config.per_layer_config[i].head_dim for i in range(config.num_hidden_layers)]
    assert sorted(set(dims)) == [256, 512] and config.num_attention_heads == 8
    # 25 layers of 8 x 256 and 5 (the global-attention ones) of 8 x 512, over 30 layers.
    assert shape_of(build_meta_model(config)).attention_width == round((25 * 2048 + 5 * 4096) / 30) == 2389


def test_an_attention_free_model_counts_its_matmuls_and_no_attention_term() -> None:
    """Mamba has no num_attention_heads: the trainer stopped at start with an AttributeError (the sweep found it)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("mamba", vocab_size=256, hidden_size=32, num_hidden_layers=2, state_size=4)
    model = build_meta_model(config)
    shape = shape_of(model)
    assert shape.attention_width == 0
    assert shape.flops_per_token(64) == shape.flops_per_token(4096) == 6 * shape.matmul_params
    assert shape.matmul_params == sum(p.numel() for p in model.parameters())  # tied: the table is the head


def test_attention_term_grows_with_sequence_length() -> None:
    shape = _shape("llama3.2-1b")
    assert shape.flops_per_token(4096) - shape.flops_per_token(2048) == 12 * 16 * 2048 * 2048


@pytest.mark.parametrize(
    ("nvml_name", "row", "bf16"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),
        ("NVIDIA H200", "H200", 989.4),
        ("NVIDIA H200 NVL", "H200 NVL", 835.5),
        ("NVIDIA GH200 480GB", "GH200", 989.4),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA A100-SXM4-40GB", "A100", 312.0),
        ("NVIDIA A100 80GB PCIe", "A100", 312.0),
        ("NVIDIA L4", "L4", 121.0),
        ("NVIDIA L40S", "L40S", 362.1),
        ("NVIDIA A10G", "A10G", 125.0),
    ],
)
def test_peak_table_matches_nvml_names(nvml_name: str, row: str, bf16: float) -> None:
    found = lookup_peak(nvml_name)
    assert found is not None and found[0] == row
    assert peak_tflops(nvml_name, "bf16") == bf16


def test_the_float8_peak_is_known_only_for_gpus_with_float8_tensor_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PEAK_OVERRIDE_ENV, raising=False)
    assert float8_peak_tflops("NVIDIA H100 80GB HBM3") == 1978.9  # 3,958 with sparsity, halved
    assert float8_peak_tflops("NVIDIA H200") == 1978.9
    assert float8_peak_tflops("NVIDIA L40S") == 733.0
    assert float8_peak_tflops("NVIDIA A100-SXM4-80GB") == 0.0  # Ampere: no float8 tensor cores
    assert float8_peak_tflops("Tesla T4") == 0.0
    assert float8_peak_tflops(None) == 0.0
    # float8 MFU is reported against the bf16 peak, as bf16's is, so the two compare.
    assert peak_tflops("NVIDIA H100 80GB HBM3", "float8") == 989.4
    monkeypatch.setenv(PEAK_OVERRIDE_ENV, "500")
    assert float8_peak_tflops("NVIDIA H100 80GB HBM3") == 0.0  # the override names one peak, not two


def test_fp32_uses_tf32_peak_only_when_enabled() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == 494.7


def test_unknown_device_and_cpu_have_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PEAK_OVERRIDE_ENV, raising=False)
    assert lookup_peak("Tesla T4") is None
    assert peak_tflops("Tesla T4", "bf16") == 0.0
    assert peak_tflops(None, "bf16") == 0.0
    assert mfu(12.5, 0.0) is None


def test_peak_override_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PEAK_OVERRIDE_ENV, "100")
    assert peak_tflops(None, "bf16") == 100.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 100.0


def test_mfu_of_a_1b_step_on_h100() -> None:
    # 40k tokens/s per device of llama3.2-1b at 2048 = 328.8 TFLOP/s = 33.2% of 989.4.
    tflops = 40_000 * _shape("llama3.2-1b").flops_per_token(2048) / 1e12
    assert tflops == pytest.approx(328.8077, rel=1e-5)
    assert mfu(tflops, 989.4) == pytest.approx(0.33233, rel=1e-4)


def _processor(
    monkeypatch: pytest.MonkeyPatch, peak: str | None, precision: str = "bf16"
) -> tuple[MetricsProcessor, io.StringIO]:
    if peak is None:
        monkeypatch.delenv(PEAK_OVERRIDE_ENV, raising=False)
    else:
        monkeypatch.setenv(PEAK_OVERRIDE_ENV, peak)
    cfg = TrainerConfig.model_validate(
        {
            "job": {"name": "flops"},
            "model": {"preset": "tiny"},
            "training": {"maxSteps": 100, "seqLen": 256, "logIntervalSteps": 1, "precision": precision},
            "metrics": {"enabled": False},
        }
    )
    world = SimpleNamespace(
        rank=0, world_size=4, local_rank=0, local_world_size=2, node_rank=0, num_nodes=2, device=torch.device("cpu")
    )
    out = io.StringIO()
    flops = FlopsShape(matmul_params=10_000_000, num_layers=4, attention_width=256)
    proc = MetricsProcessor(cfg, world, num_params=10_000_000, seq_len=256, flops=flops, stream=out)  # type: ignore[arg-type]
    return proc, out


def test_processor_log_line_numbers_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, out = _processor(monkeypatch, peak=None)
    proc.start()
    # 4 ranks, 8192 tokens in 0.5 s: 16384 tok/s for the job, 4096 per device.
    proc.on_step(
        StepStats(step=1, loss=5.0, learning_rate=1e-4, grad_norm=2.0, tokens=8192, step_seconds=0.5, data_seconds=0.1)
    )
    proc.on_step(
        StepStats(step=2, loss=4.5, learning_rate=2e-4, grad_norm=1.5, tokens=8192, step_seconds=0.5, data_seconds=0.0)
    )
    proc.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/100 | loss 5.0000 | lr 1.00e-04 | gnorm 2.00 | 16,384 tok/s (4,096/dev)")
    # FLOPs/token = 6e7 + 12*4*256*256 = 63,145,728; x 4096 tok/s = 0.2586 TFLOP/s.
    assert proc.flops_per_token == 63_145_728
    assert "0.259 TFLOP/s/dev" in lines[0]
    assert "MFU" not in lines[0]  # no peak on the CPU
    assert "data 20.0%" in lines[0]
    # ETA from the mean step time of recent steps: 98 steps left x 0.5 s.
    assert lines[1].endswith("ETA 49s")


def test_processor_reports_mfu_with_a_known_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, out = _processor(monkeypatch, peak="1.0")
    proc.on_step(
        StepStats(step=1, loss=5.0, learning_rate=1e-4, grad_norm=2.0, tokens=8192, step_seconds=0.5, data_seconds=0.0)
    )
    assert "MFU 25.9%" in out.getvalue()


def test_a_float8_run_reports_mfu_against_both_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, out = _processor(monkeypatch, peak=None, precision="float8")
    # A device whose float8 peak is twice its bf16 one, as on every GPU with float8 tensor cores
    # (the CPU has no device name to look up).
    proc.peak_tflops, proc.float8_peak_tflops = 1.0, 2.0
    for step in range(1, 6):
        stats = dict(loss=5.0, learning_rate=1e-4, grad_norm=1.0, tokens=8192, step_seconds=0.5, data_seconds=0)
        proc.on_step(StepStats(step=step, **stats))
    proc.close()
    lines = out.getvalue().splitlines()
    # 0.2586 TFLOP/s per device (test_processor_log_line_numbers_on_cpu): 25.9% of 1, 12.9% of 2.
    assert "MFU 25.9% of the bf16 peak, 12.9% of the float8 peak" in lines[0], lines[0]
    # The summary times wall clock, not step_seconds: its figures differ, the float8 one is half.
    both = re.search(r"MFU ([\d.]+)% of the bf16 peak, ([\d.]+)% of the float8 peak", lines[-1])
    assert both is not None and float(both[2]) == pytest.approx(float(both[1]) / 2, abs=0.06), lines[-1]
    assert MFU_PATTERN.search(lines[-1])["mfu"] == both[1]  # what the benchmarks read back: the bf16 figure


def test_processor_prints_a_steady_state_summary_at_close(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, out = _processor(monkeypatch, peak=None)
    for step in range(1, 6):
        proc.on_step(
            StepStats(
                step=step, loss=5.0, learning_rate=1e-4, grad_norm=1.0, tokens=8192, step_seconds=0.5, data_seconds=0
            )
        )
    proc.close()
    summary = out.getvalue().splitlines()[-1]
    # The first SUMMARY_WARMUP_STEPS (3) steps are excluded: steps 4 and 5 remain.
    assert summary.startswith("summary: steps 4-5 (2 steps in "), summary
    assert "s CPU of rank 0; this process's first 3 steps, its warm-up, not counted)" in summary
    assert "peak mem" in summary and "MFU" not in summary
