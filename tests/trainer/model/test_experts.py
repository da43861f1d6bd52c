"""``model.expertsImplementation``: a mixture-of-experts model runs the kernel asked for (or transformers'
default), says which in its log, and trains the same losses with each; a dense model refuses the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_api.contract import (
    ENV_METRICS_DIR,
    MOE_EXPERT_LOAD_MAX,
    MOE_EXPERT_LOAD_MIN,
    MOE_EXPERTS_UNUSED,
    MOE_LAYER_METRICS,
    MOE_ROUTER_AUX_LOSS,
)
from fsdp_api.ports import free_port
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.build import prepare
from fsdp_trainer.errors import ConfigError
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from tests.trainer.harness import cpu_world, launch
from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import model_config


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> Path:
    return build_checkpoint("mixtral", tmp_path_factory.mktemp("experts") / "mixtral", inputs["tokenizer"])


@pytest.mark.slow
def test_each_kernel_trains_the_same_losses_and_the_log_names_it(
    mixtral: Path, inputs: dict[str, Path], tmp_path: Path
) -> None:
    runs = {}
    for kernel in (None, "eager"):
        work = tmp_path / str(kernel)
        model = {"pretrained": str(mixtral), **({"expertsImplementation": kernel} if kernel else {})}
        cfg = model_config(work, inputs["aligned"], model, training={"maxSteps": 4, "microBatchSize": 2})
        cfg["metrics"] = {"enabled": True, "port": free_port()}
        env = {ENV_METRICS_DIR: str(work / "prometheus")}
        runs[kernel] = launch(work, cfg, env=env).check()
    assert "experts: grouped_mm (transformers' default for this model; 2 experts modules)" in runs[None].output
    assert "experts: eager (model.expertsImplementation: eager; 2 experts modules)" in runs["eager"].output
    default, eager = runs[None].losses(), runs["eager"].losses()
    assert sorted(default) == [1, 2, 3, 4]
    for step, loss in default.items():
        assert abs(loss - eager[step]) <= 1e-5, (step, loss, eager[step])
    # Router health: each MoE layer's expert load, once per node (its local rank 0), over every rank's tokens.
    assert "router health: 2 MoE layers (4 experts, top 2), expert load exported per layer" in runs[None].output
    [directory] = list((tmp_path / "None" / "prometheus").glob("fsdp-trainer-metrics/*/restart-0"))
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    found = {
        (s.name, s.labels["layer"], s.labels["local_rank"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("fsdp_moe_")
    }
    for metric in MOE_LAYER_METRICS:
        assert {(layer, rank) for name, layer, rank in found if name == metric.name} == {("0", "0"), ("1", "0")}
    for layer in ("0", "1"):
        top, low = found[(MOE_EXPERT_LOAD_MAX.name, layer, "0")], found[(MOE_EXPERT_LOAD_MIN.name, layer, "0")]
        assert low <= 1.0 <= top <= 2.0, (layer, low, top)  # 4 experts, top 2: at most twice the mean
        assert 0.0 <= found[(MOE_EXPERTS_UNUSED.name, layer, "0")] < 1.0
        assert found[(MOE_ROUTER_AUX_LOSS.name, layer, "0")] >= 2.0 - 1e-6  # top_k is the even router's


def test_a_dense_model_refuses_the_field_in_one_line(inputs: dict[str, Path], tmp_path: Path) -> None:
    llama = build_checkpoint("llama", tmp_path / "llama", inputs["tokenizer"])
    cfg = model_config(tmp_path, inputs["aligned"], {"architecture": str(llama), "expertsImplementation": "eager"})
    with pytest.raises(ConfigError) as err:
        prepare(TrainerConfig.model_validate(cfg), cpu_world(1, 1))
    assert err.value.lines == [
        "model.expertsImplementation: LlamaForCausalLM has no mixture-of-experts layers, so there is no experts "
        "kernel to choose: leave it unset"
    ]


@pytest.mark.slow
def test_the_router_aux_loss_is_trained_and_the_logged_loss_stays_the_token_loss(
    mixtral: Path, inputs: dict[str, Path], tmp_path: Path
) -> None:
    runs = {}
    for coef in (0.0, 0.5):
        work = tmp_path / str(coef)
        training = {"maxSteps": 3, "microBatchSize": 2, "gradAccumSteps": 2, "routerAuxLossCoef": coef}
        cfg = model_config(work, inputs["aligned"], {"pretrained": str(mixtral)}, training=training)
        runs[coef] = launch(work, cfg).check()
    line = "training.routerAuxLossCoef: 0.5 x the load-balancing loss of 2 routers (4 experts) added to the loss"
    assert line in runs[0.5].output and "routerAuxLossCoef" not in runs[0.0].output
    plain, balanced = runs[0.0].losses(), runs[0.5].losses()
    # The same weights at step 1: the same token loss logged, the balancing term left out of it.
    assert abs(plain[1] - balanced[1]) <= 1e-6, (plain[1], balanced[1])
    # Its gradient moved the routers: the next steps' token losses differ.
    assert abs(plain[3] - balanced[3]) > 1e-6, (plain[3], balanced[3])


def test_a_dense_model_refuses_the_router_aux_loss_in_one_line(inputs: dict[str, Path], tmp_path: Path) -> None:
    llama = build_checkpoint("llama", tmp_path / "llama", inputs["tokenizer"])
    cfg = model_config(tmp_path, inputs["aligned"], {"architecture": str(llama)}, training={"routerAuxLossCoef": 0.01})
    with pytest.raises(ConfigError) as err:
        prepare(TrainerConfig.model_validate(cfg), cpu_world(1, 1))
    assert err.value.lines == [
        "training.routerAuxLossCoef: LlamaForCausalLM has no mixture-of-experts routers, so there is no load to "
        "balance: leave it at 0"
    ]
