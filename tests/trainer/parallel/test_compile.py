"""training.compile: the decision per device, inductor on 2 FSDP ranks, and the fall back to eager.

The fallback is exercised with a real failure, not a fake: on CPU ranks
inductor builds C++ with the compiler ``CXX`` names, and a compiler that does
not exist fails the build as Triton does on a GPU node without a C compiler.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch._inductor.compile_fx
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.model.architecture import decoder_units
from fsdp_trainer.parallel.compile import CompileReport, inductor_or_eager
from peft import LoraConfig, inject_adapter_in_model
from transformers import AutoConfig, AutoModelForCausalLM

from tests.trainer.harness import ParityRuns, RunResult, launch
from tests.trainer.model.architectures import ARCHITECTURES

STEPS = 3  # the reference's warm-up is 2 steps: its first 3 losses do not depend on maxSteps
NO_COMPILER = "/nonexistent/c++"


def _training(**values: object) -> TrainerConfig:
    training = {"maxSteps": 5, **values}
    cfg = {"job": {"name": "t"}, "model": {"preset": "tiny"}, "data": {"path": "x"}, "training": training}
    return TrainerConfig.model_validate(cfg).training


def test_unset_compiles_on_gpus_only_and_a_setting_wins_everywhere() -> None:
    assert _training().compile_decision("cuda") == (True, "training.compile unset: on for GPU ranks")
    assert _training().compile_decision("cpu") == (False, "training.compile unset: off on CPU ranks")
    assert _training(compile=False).compile_decision("cuda") == (False, "training.compile: false")
    assert _training(compile=True).compile_decision("cpu") == (True, "training.compile: true")


def test_a_graph_inductor_cannot_build_runs_eager_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for inductor's failure: a real one (the 2-rank test below) leaves
    # inductor's cached compiler checks failing for the rest of this process.
    def fail(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.\nmore detail")

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", fail)
    torch._dynamo.reset()
    report = CompileReport(True, "training.compile: true")
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(4, 8, requires_grad=True)
    want = layer(x)
    got = torch.compile(layer, backend=inductor_or_eager(report))(x)
    got.sum().backward()
    assert x.grad is not None
    assert (report.mode, report.compiled) == ("eager", 0)
    assert report.fallbacks == ["RuntimeError: Failed to find C compiler. Please specify via CC environment variable."]
    assert report.record() == {"mode": "eager", "reason": "training.compile: true", "graphs": 0, "fallbacks": 1}
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _compiled_run(tmp_path: Path, parity_runs: ParityRuns, env: dict[str, str] | None = None) -> RunResult:
    """The parity runs' ``full`` variant (2 ranks, same global batches as the reference), compiled, cut short.

    Its first STEPS losses equal the 20-step reference's: they follow the
    updates of the warm-up steps, whose learning rates do not depend on
    maxSteps. No validation: its no-grad forward would compile a second graph.
    """
    cfg = parity_runs.config("full")
    cfg["training"].update(compile=True, maxSteps=STEPS, evalIntervalSteps=0)
    cfg["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    return launch(tmp_path, cfg, env=env, timeout=600).check()


def _worst(run: RunResult, ref: RunResult) -> float:
    ref_loss, loss = ref.losses(), run.losses()
    assert sorted(loss) == list(range(1, STEPS + 1))
    worst = max(abs(loss[s] - ref_loss[s]) for s in loss)
    print(f"largest loss difference from the eager reference over {STEPS} steps: {worst:.2e}")
    return worst


@pytest.mark.slow
def test_two_compiled_ranks_train_like_one_eager_process(tmp_path: Path, parity_runs: ParityRuns) -> None:
    run = _compiled_run(tmp_path, parity_runs)
    (event,) = run.events("compile")
    assert (event["step"], event["mode"], event["fallbacks"]) == (1, "inductor", 0), event
    assert event["graphs"] >= 1
    assert "compile: the decoder layers through inductor (training.compile: true)" in run.output
    assert "inductor failed" not in run.output
    # Inductor fuses and reorders fp32 arithmetic: close to the eager reference, not bitwise (measured 9.5e-7).
    worst = _worst(run, parity_runs.get("reference"))
    assert worst <= 1e-4, f"largest loss difference {worst:.2e}"


@pytest.mark.slow
def test_without_a_compiler_the_layers_run_eager_and_say_why(tmp_path: Path, parity_runs: ParityRuns) -> None:
    run = _compiled_run(tmp_path, parity_runs, env={"CXX": NO_COMPILER})
    for rank in (0, 1):
        (event,) = run.events("compile", rank)
        assert (event["mode"], event["graphs"]) == ("eager", 0), event
        assert event["fallbacks"] >= 1
    warnings = [line for line in run.output.splitlines() if "inductor failed" in line]
    assert len(warnings) == 2, warnings  # one line per rank
    assert "the decoder layers run eager" in warnings[0]
    # Eager is the model's own arithmetic: as exact as the uncompiled parity runs (measured 4.8e-7).
    worst = _worst(run, parity_runs.get("reference"))
    assert worst <= 1e-4, f"largest loss difference {worst:.2e}"


@pytest.mark.slow
def test_lora_layers_compile_and_give_eager_gradients() -> None:
    """With unset compile a LoRA job on GPUs compiles: PEFT's adapter layers must trace and match eager."""
    config = AutoConfig.for_model("llama", **ARCHITECTURES["llama"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    for p in model.parameters():
        p.requires_grad_(False)
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = inject_adapter_in_model(lora, model)
    eager = copy.deepcopy(model)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    eager(input_ids=ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    report = CompileReport(True, "training.compile: true")
    for unit in decoder_units(model):
        unit.module.compile(backend=inductor_or_eager(report))
    model(input_ids=ids, labels=ids).loss.backward()
    assert (report.mode, report.fallbacks) == ("inductor", [])
    assert report.compiled >= 1
    want = {n: p.grad for n, p in eager.named_parameters() if p.grad is not None}
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert sorted(got) == sorted(want) and all(".lora_" in n for n in got)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6)
