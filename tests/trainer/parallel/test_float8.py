"""training.precision: float8, through torchao: which layers convert, that every test architecture
runs a step, and that 2 gloo ranks (torchao emulates the float8 matmuls on the CPU) train like bf16."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.build import prepare
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.parallel.float8 import apply_float8, float8_plan
from peft import LoraConfig, inject_adapter_in_model
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.trainer_run import TrainerRun
from tests.trainer.harness import base_config, cpu_world, launch
from tests.trainer.model.architectures import ARCHITECTURES

FLOAT8_ARCHITECTURES = sorted(set(ARCHITECTURES) - {"gpt2"})  # GPT-2's blocks use Conv1D, not Linear
STEPS = 20
# Over 20 steps the float8 run stayed within 0.011 of the bf16 one (the same data, seed and init).
LOSS_TOLERANCE = 0.05
RESUME_TOLERANCE = 1e-4
# The export against the run's own float8 logits: measured 0.063; an untrained model is 1.4 off.
EXPORT_TOLERANCE = 0.2


def _model(name: str, device: str = "meta") -> torch.nn.Module:
    config = AutoConfig.for_model(name, **ARCHITECTURES[name])
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config)


def test_the_blocks_linears_convert_and_the_head_and_routers_do_not() -> None:
    llama = float8_plan(_model("llama"))
    # 2 layers x (q, k, v, o, gate, up, down)
    assert len(llama.converted) == 14
    assert llama.skipped == {"lm_head": "output head"}
    # Mixtral: attention converts; the router (a MixtralTopKRouter) and the experts (3-D parameters) are no Linear.
    mixtral = float8_plan(_model("mixtral"))
    assert len(mixtral.converted) == 8
    # Its experts are 3-D parameters, not Linear layers: they stay bf16, and the log line says so.
    assert mixtral.summary() == (
        "8 Linear layers in float8; kept in bf16: 2 experts modules' 3-D weights (float8 converts Linear layers "
        "only), 1 output head"
    )
    assert mixtral.kept_linears == 1  # what fsdp_train_float8_kept_linear_layers counts


def test_a_router_that_is_a_linear_stays_in_bf16() -> None:
    model = _model("llama")
    model.model.layers[1].mlp.gate = torch.nn.Linear(32, 16, bias=False, device="meta")
    assert float8_plan(model).skipped["model.layers.1.mlp.gate"] == "router"


def test_with_lora_the_frozen_base_converts_and_the_adapters_train_in_bf16() -> None:
    model = _model("llama", "cpu")
    for p in model.parameters():
        p.requires_grad_(False)
    model = inject_adapter_in_model(LoraConfig(r=16, target_modules=["q_proj", "v_proj"]), model)
    report = apply_float8(model, "tensorwise", torch.device("cpu"), fsdp=False)
    assert "model.layers.0.self_attn.q_proj.base_layer" in report.converted
    assert report.skipped["model.layers.0.self_attn.q_proj.lora_A.default"] == "LoRA adapter"
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, labels=ids).loss.backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all(".lora_" in n for n in trained)


def test_a_dimension_float8_cannot_take_stays_in_bf16() -> None:
    model = _model("llama")
    model.model.layers[0].mlp.down_proj = torch.nn.Linear(24, 32, bias=False, device="meta")
    report = float8_plan(model)
    assert report.skipped["model.layers.0.mlp.down_proj"] == "dimension not divisible by 16"


@pytest.mark.parametrize("name", FLOAT8_ARCHITECTURES)
def test_every_test_architecture_converts_and_trains_a_step(name: str) -> None:
    model = _model(name, "cpu").train()
    report = apply_float8(model, "tensorwise", torch.device("cpu"), fsdp=False)
    converted = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == set(report.converted) and converted
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(m.weight.grad is not None for n, m in model.named_modules() if n in converted)


def test_a_model_with_no_convertible_layer_is_refused_in_one_line(tmp_path: Path, inputs: dict[str, Path]) -> None:
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    AutoConfig.for_model("gpt2", **ARCHITECTURES["gpt2"]).save_pretrained(gpt2)
    cfg = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"], training={"precision": "float8"})
    cfg["model"] = {"architecture": str(gpt2)}
    with pytest.raises(ConfigError) as e:
        prepare(TrainerConfig.model_validate(cfg), cpu_world(1, 1))
    assert e.value.lines == [
        "training.precision: float8: no Linear layer of GPT2LMHeadModel's decoder blocks can run in float8 "
        "(0 Linear layers in float8; kept in bf16: 1 output head); use bf16"
    ]


def _config(work: Path, inputs: dict[str, Path], precision: str) -> dict:
    return base_config(
        work,
        inputs["aligned"],
        inputs["tokenizer"],
        training={"precision": precision, "maxSteps": STEPS},
        fsdp={"shardingStrategy": "full"},
        checkpoint={"intervalSteps": STEPS // 2},
    )


@pytest.mark.slow
def test_two_ranks_in_float8_train_like_bf16_resume_exactly_and_export_plain_weights(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    runs = {}
    for precision in ("bf16", "float8"):
        runs[precision] = launch(tmp_path / precision, _config(tmp_path / precision, inputs, precision)).check()
    assert runs["bf16"].events("start")[0]["float8_linears"] == 0
    float8 = runs["float8"]
    # the harness model: 2 layers x 7 projections
    assert float8.events("start")[0]["float8_linears"] == 14
    assert "float8 (tensorwise recipe, emulated on the CPU): 14 Linear layers in float8" in float8.output
    bf16_loss, float8_loss = runs["bf16"].losses(), float8.losses()
    assert sorted(float8_loss) == list(range(1, STEPS + 1))
    worst = max(abs(float8_loss[s] - bf16_loss[s]) for s in bf16_loss)
    assert worst <= LOSS_TOLERANCE, f"float8 strayed {worst:.4f} from bf16"
    assert float8_loss[STEPS] < float8_loss[1] - 0.3  # it trained

    # Stopped at the half-way checkpoint and resumed: the same losses as the run that went on.
    half = STEPS // 2
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(
        tmp_path / "float8" / "checkpoints" / f"step-{half:08d}", resumed_dir / "checkpoints" / f"step-{half:08d}"
    )
    resumed = launch(resumed_dir, _config(resumed_dir, inputs, "float8")).check()
    after = resumed.losses()
    assert sorted(after) == list(range(half + 1, STEPS + 1))
    print(f"float8 resumed: max |loss difference| {max(abs(after[s] - float8_loss[s]) for s in after):.2e}")
    for step, loss in after.items():
        assert abs(loss - float8_loss[step]) <= RESUME_TOLERANCE, (step, loss, float8_loss[step])

    # The export is the architecture's own weights in a plain dtype, not torchao's float8 layers.
    from fsdp_trainer.export import export_checkpoint

    exported = export_checkpoint(tmp_path / "float8" / "checkpoints", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(exported).eval()
    fresh = AutoModelForCausalLM.from_config(hf.config)
    assert hf.state_dict().keys() == fresh.state_dict().keys()
    assert {t.dtype for t in hf.state_dict().values()} <= {torch.float32, torch.bfloat16}
    assert not any("Float8" in type(m).__name__ for m in hf.modules())
    probe = torch.load(float8.trace_dir / "probe.pt")
    with torch.no_grad():
        logits = hf(input_ids=probe["input_ids"]).logits.float()
        untrained = fresh.eval()(input_ids=probe["input_ids"]).logits.float()
    # The run's own logits came from float8 matmuls; the export computes in full precision.
    gap = (logits - probe["logits"]).abs().max().item()
    far = (untrained - probe["logits"]).abs().max().item()
    print(f"export vs the run's float8 logits: max |difference| {gap:.3f} (an untrained model: {far:.3f})")
    assert gap <= EXPORT_TOLERANCE < far


@pytest.mark.slow
def test_the_metrics_count_the_layers_in_float8_and_those_kept_in_bf16(tmp_path: Path) -> None:
    """Both ranks say what converted: the small model's 2 x 7 projections, and the output head kept."""
    seen: dict[str, dict[str, float]] = {}
    with TrainerRun(tmp_path, max_steps=4, overrides={"training": {"precision": "float8"}}) as run:
        while run.running():
            for s in run.scrape() or ():
                if s.name.startswith("fsdp_train_float8_"):
                    seen.setdefault(s.name, {})[s.labels["local_rank"]] = s.value
            time.sleep(0.1)
        assert run.wait() == 0, run.output()
    assert seen == {
        "fsdp_train_float8_linear_layers": {"0": 14.0, "1": 14.0},
        "fsdp_train_float8_kept_linear_layers": {"0": 1.0, "1": 1.0},
    }, run.output()
