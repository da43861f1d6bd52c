"""Expert parallelism (``parallelism.expert``) from each architecture's own transformers plan.

Four gloo ranks train tiny Mixtral, Qwen2-MoE (a gated shared expert),
DeepSeek V3 (a shared expert, a dense first layer, group-limited routing) and
Qwen3-MoE (with LoRA on its attention, the experts frozen) models with their
experts split over 2 ranks (and over 4 for DeepSeek V3: 4 experts, one per
rank), and Mixtral beside context parallelism and hybrid sharding, with the per-step losses and gradient norms of the
same 4 ranks without expert parallelism, in fp32, over 10 steps (OLMoE passes
too; it is left out to keep the suite's time); a checkpoint written with
expert 2 resumes with expert 1 on the same curve and exports to a directory
transformers loads with the same loss; and what cannot be split is refused
before any process group exists, in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.harness import RunResult, launch
from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import (
    STEPS,
    assert_resumed_curve,
    model_config,
    prepare_error,
    same_curve,
)

# model type -> the expert-parallel degrees compared with expert 1, and the peft section.
SPLITS: dict[str, tuple[tuple[int, ...], dict[str, Any] | None]] = {
    "mixtral": ((2,), None),
    "qwen2_moe": ((2,), None),
    "deepseek_v3": ((2, 4), None),
    "qwen3_moe": ((2,), {"rank": 4}),
}
MOE_MODELS = (*SPLITS, "olmoe")


@pytest.fixture(scope="module")
def moe_checkpoints(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-models")
    return {name: build_checkpoint(name, root / name, inputs["tokenizer"]) for name in MOE_MODELS}


def _config(
    work: Path,
    data: Path,
    checkpoint: Path,
    expert: int,
    peft: dict[str, Any] | None = None,
    context: int = 1,
    fsdp: dict[str, Any] | None = None,
    checkpointing: str = "none",
) -> dict[str, Any]:
    # With context parallelism 2 data-parallel ranks of 2 rows each: the same 4 rows a step.
    training = {"maxSteps": STEPS, "microBatchSize": 1} if context == 1 else {"microBatchSize": 2, "seqLen": 16}
    cfg = model_config(
        work,
        data,
        {"pretrained": str(checkpoint)},
        training={"maxSteps": STEPS, "activationCheckpointing": checkpointing, **training},
        parallelism={"expert": expert, "context": context},
        fsdp=fsdp or {},
    )
    if peft is not None:
        cfg["peft"] = peft
    return cfg


def _run(work: Path, data: Path, checkpoint: Path, expert: int, **options: Any) -> RunResult:
    return launch(work, _config(work, data, checkpoint, expert, **options), nproc=4).check()


@pytest.mark.slow
@pytest.mark.parametrize("name", SPLITS)
def test_experts_split_over_2_and_4_ranks_train_like_fsdp_alone(
    name: str, moe_checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    data, checkpoint = inputs["aligned"], moe_checkpoints[name]
    degrees, peft = SPLITS[name]
    reference = _run(tmp_path / "ep1", data, checkpoint, 1, peft=peft)
    for expert in degrees:
        split = _run(tmp_path / f"ep{expert}", data, checkpoint, expert, peft=peft)
        assert split.events("start")[0]["mesh"] == {"shard": 4, "ep": expert}
        # Every MoE layer's experts (DeepSeek V3's first layer is dense).
        layers = 1 if name == "deepseek_v3" else 2
        assert f"{layers} experts modules split over {expert} ranks" in split.output, split.output[-3000:]
        same_curve(reference, split, f"{name} expert {expert}: ")


BESIDE = {
    # The context ranks hold other tokens of the same rows, so they are expert-parallel peers too; FSDP
    # averages a dense gradient over data x context ranks, and an expert's over the same count.
    "context 2": ({"context": 2}, {"shard": 2, "cp": 2, "ep": 2}),
    # 2 groups of 2 ranks: each group holds every expert once (efsdp 1), and the groups replicate them.
    # FSDP divides after the replicas' all-reduce by itself: a forced sum would divide twice. With
    # activation checkpointing, whose recomputation runs the all-to-alls again.
    "hybrid 2x2": (
        {"fsdp": {"shardingStrategy": "hybrid", "shardGroupSize": 2}, "checkpointing": "full"},
        {"replicate": 2, "shard": 2, "ep": 2},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("beside", BESIDE)
def test_experts_split_beside_context_parallelism_or_inside_hybrid_groups_train_like_without_the_split(
    beside: str, moe_checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    options, mesh = BESIDE[beside]
    data, checkpoint = inputs["aligned"], moe_checkpoints["mixtral"]
    reference = _run(tmp_path / "ep1", data, checkpoint, 1, **options)
    split = _run(tmp_path / "ep2", data, checkpoint, 2, **options)
    assert split.events("start")[0]["mesh"] == mesh
    same_curve(reference, split, f"mixtral {beside} expert 2: ")


@pytest.mark.slow
def test_an_expert_2_checkpoint_resumes_with_expert_1_and_exports(
    moe_checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    from fsdp_trainer.export import export_checkpoint
    from transformers import AutoModelForCausalLM

    data, checkpoint = inputs["aligned"], moe_checkpoints["deepseek_v3"]
    split_cfg = _config(tmp_path / "ep2", data, checkpoint, 2)
    split_cfg["checkpoint"]["intervalSteps"] = 5
    split = launch(tmp_path / "ep2", split_cfg, nproc=4).check()
    # The same run stopped at step 5, resumed with every expert whole on each rank (DCP reshards them).
    shutil.copytree(
        tmp_path / "ep2" / "checkpoints" / "step-00000005", tmp_path / "ep1" / "checkpoints" / "step-00000005"
    )
    resumed = _run(tmp_path / "ep1", data, checkpoint, 1)
    assert resumed.events("start")[0]["step"] == 5
    assert resumed.events("start")[0]["mesh"] == {"shard": 4}
    before, after = split.losses(), resumed.losses()
    assert_resumed_curve(before, after)

    # The export of an expert-parallel checkpoint is the model's own layout, with the trained weights.
    exported = export_checkpoint(tmp_path / "ep2" / "checkpoints", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    probe = torch.load(split.trace_dir / "probe.pt")
    with torch.no_grad():
        logits = hf(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], atol=1e-5, rtol=1e-5)


def test_a_dense_model_and_an_uneven_split_are_refused_in_one_line(
    moe_checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    dense = build_checkpoint("llama", tmp_path / "llama", inputs["tokenizer"])
    message = prepare_error(_config(tmp_path / "d", inputs["aligned"], dense, 2))
    assert message == (
        "parallelism.expert: LlamaForCausalLM has no mixture-of-experts layers, so there are no experts to split: "
        "leave it at 1"
    )
    torch.manual_seed(0)
    # 4 experts cannot go to 8 ranks whole.
    message = prepare_error(_config(tmp_path / "u", inputs["aligned"], moe_checkpoints["mixtral"], 8), world_size=8)
    assert message == (
        "parallelism.expert: 8 does not divide MixtralForCausalLM's 4 experts per layer: each rank holds whole experts"
    )
