"""Tensor parallelism (``parallelism.tensor``) from each architecture's own transformers plan.

Four gloo ranks as tensor 2 x data 2 train pretrained tiny Llama, Qwen2 and
Mistral models (each declares a plan), and Qwen3, Gemma 3 and Phi-3 (whose
plans use per-head norms and gathered fused projections), with the losses
and gradient norms of a single process to 1e-4 over 10 steps; a checkpoint written by that split resumes as tensor 1 x
data 4 on the same loss curve (DCP reshards the 2-D shards); and what cannot
be split is refused before any process group exists, in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.build import prepare
from fsdp_trainer.errors import ConfigError

from tests.trainer.harness import cpu_world, launch, write_aligned_jsonl
from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import MODELS, STEPS, TP_STYLE_MODELS, model_config, one_process_and_split


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_tensor_2_by_data_2_trains_like_one_process(
    name: str, checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    _, split = one_process_and_split(tmp_path, inputs["aligned"], checkpoints[name], {"tensor": 2})
    assert split.events("start")[0]["mesh"] == {"shard": 2, "tp": 2}


@pytest.mark.slow
@pytest.mark.parametrize("name", TP_STYLE_MODELS)
def test_plans_with_per_head_norms_and_fused_projections_train_like_one_process(
    name: str, checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    # Without the summed norm gradients Qwen3's and Gemma 3's grad norms (compared per step) differ;
    # without the gathered outputs Phi-3's chunk of gate_up_proj pairs the wrong halves.
    _, split = one_process_and_split(tmp_path, inputs["aligned"], checkpoints[name], {"tensor": 2})
    assert split.events("start")[0]["mesh"] == {"shard": 2, "tp": 2}
    assert "projections split over 2 ranks" in split.output, split.output[-2000:]


def _same_document(path: Path, copies: int = 200) -> Path:
    """One window-long document, repeated: every data split and epoch gives the same batches,
    so a resume on another data-parallel size continues the very same loss curve."""
    write_aligned_jsonl(path.with_suffix(".one"), 1)
    line = path.with_suffix(".one").read_text()
    path.write_text(line * copies)
    return path


@pytest.mark.slow
def test_a_tensor_2_checkpoint_resumes_as_tensor_1_by_data_4_and_exports(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from fsdp_trainer.export import export_checkpoint
    from transformers import AutoModelForCausalLM

    data = _same_document(tmp_path / "same.jsonl")
    model = {"pretrained": str(checkpoints["llama"])}

    # Global batch 4 windows either way: 2 data-parallel ranks x 2, or 4 x 1.
    def config(work: str, tensor: int, micro_batch: int) -> dict[str, Any]:
        training = {"maxSteps": STEPS, "microBatchSize": micro_batch}
        return model_config(
            tmp_path / work,
            data,
            model,
            training=training,
            parallelism={"tensor": tensor},
            checkpoint={"intervalSteps": 5},
        )

    whole = launch(tmp_path / "tp2", config("tp2", 2, 2), nproc=4).check()
    # The same run stopped at step 5: its checkpoint, in another directory.
    resumed_dir = tmp_path / "tp1" / "checkpoints"
    shutil.copytree(tmp_path / "tp2" / "checkpoints" / "step-00000005", resumed_dir / "step-00000005")
    second = config("tp1", 1, 1)
    resumed = launch(tmp_path / "tp1", second, nproc=4).check()
    assert resumed.events("start")[0]["step"] == 5
    assert resumed.events("start")[0]["mesh"] == {"shard": 4}
    before, after = whole.losses(), resumed.losses()
    assert sorted(after) == list(range(6, STEPS + 1))
    print(f"resumed: max |loss difference| {max(abs(after[s] - before[s]) for s in after):.2e}")
    for step, loss in after.items():
        assert abs(loss - before[step]) <= 1e-4, (step, loss, before[step])
    assert before[STEPS] < before[1]

    # The export of a tensor-parallel checkpoint is an ordinary transformers model with the trained weights.
    exported = export_checkpoint(tmp_path / "tp2" / "checkpoints", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    probe = torch.load(whole.trace_dir / "probe.pt")
    with torch.no_grad():
        logits = hf(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], atol=1e-5, rtol=1e-5)


def _refusal(cfg: dict[str, Any], world: int, local: int) -> str:
    with pytest.raises(ConfigError) as err:
        prepare(TrainerConfig.model_validate(cfg), cpu_world(world, local))
    assert len(err.value.lines) == 1, err.value.lines
    return err.value.lines[0]


@pytest.mark.parametrize(
    ("name", "tensor", "world", "local", "expected"),
    [
        # No plan in transformers: GPT-2 declares none.
        ("gpt2", 2, 2, 2, "parallelism.tensor: GPT2LMHeadModel declares no tensor-parallel plan in transformers"),
        # Mixtral's experts are packed and expert-parallel in its plan.
        ("mixtral", 2, 2, 2, "MixtralForCausalLM's tensor-parallel plan uses the styles moe_tp_experts, packed_"),
        # 4 ranks cannot split 2 key-value heads.
        ("llama", 4, 4, 4, "parallelism.tensor: 4 does not divide LlamaForCausalLM's num_key_value_heads (2)"),
        # A tensor-parallel group across nodes (2 processes per node).
        ("llama", 4, 4, 2, "parallelism.tensor: 4 does not divide the 2 processes per node"),
    ],
)
def test_what_cannot_be_split_is_refused_in_one_line(
    name: str, tensor: int, world: int, local: int, expected: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    path = build_checkpoint(name, tmp_path / name, inputs["tokenizer"])
    cfg = model_config(tmp_path, inputs["aligned"], {"architecture": str(path)}, parallelism={"tensor": tensor})
    assert expected in _refusal(cfg, world, local)


def test_lora_float8_and_cpu_offload_with_tensor_parallelism_are_refused_by_the_config() -> None:
    from pydantic import ValidationError

    base = {"model": {"preset": "tiny"}, "training": {"maxSteps": 1}, "parallelism": {"tensor": 2}}
    cases = {
        "peft (LoRA) with parallelism.tensor > 1 is not supported": {"peft": {"rank": 8}},
        "training.precision float8 with parallelism.tensor > 1 is not supported yet": {
            "training": {"maxSteps": 1, "precision": "float8"}
        },
        "fsdp.cpuOffload with parallelism.tensor > 1 is not supported": {"fsdp": {"cpuOffload": True}},
    }
    for message, extra in cases.items():
        with pytest.raises(ValidationError) as err:
            TrainerConfig.model_validate({**base, **extra})
        assert message in str(err.value)
    TrainerConfig.model_validate(base)  # on its own it is fine
