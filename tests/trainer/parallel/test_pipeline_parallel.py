"""Pipeline parallelism (``parallelism.pipeline``) on any causal LM, against data parallelism alone.

Four gloo ranks train tiny models split into 2 stages (pipeline 2 x data 2)
and give, in fp32 over 10 steps, the per-step losses and gradient norms of 2
data-parallel ranks without stages, for Llama (4 layers, 2 per stage),
Gemma 3 (sliding-window and full-attention layers, scaled embeddings) and
GPT-2 (learned positions added between the embedding and the first layer)
with 1F1B, and Mistral (sliding window) with GPipe; so do LoRA adapters and
packed chat rows (each stage builds the same document mask), and pipeline 2 x
tensor 2 gives what one process does; so does the validation loss. A checkpoint written
with pipeline 2 resumes with
pipeline 1 on the same curve, and its export loads in transformers. What the
trainer cannot split is refused before any process group exists, in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_trainer.parallel.pipeline import balanced_ranges
from fsdp_trainer.step.pipeline import idle_share

from tests.trainer.harness import RunResult, launch
from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import (
    STEPS,
    assert_resumed_curve,
    model_config,
    prepare_error,
    same_curve,
)

# model type -> (the checkpoint's overrides, the schedule). Untied embeddings: tied ones are refused.
PIPELINED: dict[str, tuple[dict[str, Any], str]] = {
    "llama": ({"num_hidden_layers": 4}, "1F1B"),  # its parity is the resume test's (the same runs)
    "gemma3_text": ({"tie_word_embeddings": False}, "1F1B"),
    "gpt2": ({"tie_word_embeddings": False}, "1F1B"),
    "mistral": ({"tie_word_embeddings": False}, "GPipe"),
}


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipeline-models")
    return {
        name: build_checkpoint(name, root / name, inputs["tokenizer"], **overrides)
        for name, (overrides, _) in PIPELINED.items()
    }


def _config(work: Path, data: Path, checkpoint: Path, **parallelism: Any) -> dict[str, Any]:
    # Every run: 2 micro-batches of 2 rows per data-parallel rank and step (the pipeline's micro-batches).
    return model_config(
        work,
        data,
        {"pretrained": str(checkpoint)},
        training={"maxSteps": STEPS, "microBatchSize": 2, "gradAccumSteps": 2},
        parallelism=parallelism,
    )


def _run(work: Path, data: Path, checkpoint: Path, nproc: int | None, **parallelism: Any) -> RunResult:
    return launch(work, _config(work, data, checkpoint, **parallelism), nproc=nproc).check()


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PIPELINED if n != "llama"])
def test_two_stages_over_two_data_parallel_ranks_train_like_data_parallelism_alone(
    name: str, untied: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    data, checkpoint = inputs["aligned"], untied[name]
    schedule = PIPELINED[name][1]
    # Validation at steps 5 and 10: the held-out batches through the stages, forward only.
    runs = []
    for work, nproc, parallelism in (("dp2", 2, {}), ("pp2", 4, {"pipeline": 2, "pipelineSchedule": schedule})):
        cfg = _config(tmp_path / work, data, checkpoint, **parallelism)
        cfg["training"]["evalIntervalSteps"] = 5
        runs.append(launch(tmp_path / work, cfg, nproc=nproc).check())
    reference, split = runs
    evals = [{r["step"]: r["loss"] for r in run.events("eval")} for run in runs]
    assert sorted(evals[1]) == [5, 10]
    for step, loss in evals[0].items():
        assert evals[1][step] == pytest.approx(loss, abs=1e-4), (step, evals)
    assert split.events("start")[0]["mesh"] == {"shard": 2, "pp": 2}
    layers = PIPELINED[name][0].get("num_hidden_layers", 2)
    assert f"stage 0 of 2: layers 0-{layers // 2 - 1}" in split.output, split.output[-3000:]  # rank 0's log
    assert f"schedule {schedule} over 2 micro-batches per step (each stage idle 33% of a step)" in split.output
    same_curve(reference, split, f"{name} pipeline 2 {schedule}: ")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lora", "chat"])
def test_lora_and_packed_chats_train_through_the_stages_like_data_parallelism_alone(
    variant: str, untied: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    from tests.trainer.data.chat_inputs import build_chat_tokenizer, write_chat_jsonl

    data, checkpoint = inputs["aligned"], untied["llama"]
    sections: dict[str, Any] = {"peft": {"rank": 4}}
    if variant == "chat":
        # Packed conversations: every stage gets the rows' positions, so each builds the same document mask.
        tokenizer = build_chat_tokenizer(tmp_path / "chat-tokenizer")
        data = write_chat_jsonl(tmp_path / "chat.jsonl", 400)
        checkpoint = build_checkpoint("llama", tmp_path / "chat-llama", tokenizer, num_hidden_layers=4)
        sections = {"data": {"format": "chat"}}
    runs = []
    for work, nproc, parallelism in ((tmp_path / "dp2", 2, {}), (tmp_path / "pp2", 4, {"pipeline": 2})):
        cfg = _config(work, data, checkpoint, **parallelism)
        for name, values in sections.items():
            cfg[name] = {**cfg.get(name, {}), **values}
        runs.append(launch(work, cfg, nproc=nproc).check())
    same_curve(*runs, f"{variant} pipeline 2: ")


@pytest.mark.slow
def test_two_stages_of_two_tensor_parallel_ranks_train_like_one_process(
    untied: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    data, checkpoint = inputs["aligned"], untied["llama"]
    cfg = _config(tmp_path / "one", data, checkpoint)
    cfg["training"]["microBatchSize"] = 2
    reference = launch(tmp_path / "one", cfg, nproc=None).check()
    # One data-parallel rank: the same 2 micro-batches of 2 rows a step.
    split_cfg = _config(tmp_path / "pp2tp2", data, checkpoint, pipeline=2, tensor=2)
    split = launch(tmp_path / "pp2tp2", split_cfg, nproc=4).check()
    assert split.events("start")[0]["mesh"] == {"shard": 1, "pp": 2, "tp": 2}
    same_curve(reference, split, "llama pipeline 2 x tensor 2: ")


@pytest.mark.slow
def test_a_pipeline_2_checkpoint_resumes_with_pipeline_1_and_exports(
    untied: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    from fsdp_trainer.export import export_checkpoint
    from transformers import AutoModelForCausalLM

    data, checkpoint = inputs["aligned"], untied["llama"]
    reference = _run(tmp_path / "dp2", data, checkpoint, 2)
    split_cfg = _config(tmp_path / "pp2", data, checkpoint, pipeline=2)
    split_cfg["checkpoint"]["intervalSteps"] = 5
    split = launch(tmp_path / "pp2", split_cfg, nproc=4).check()
    # Llama's 4 layers, 2 per stage, with 1F1B: the curve of 2 data-parallel ranks without stages.
    assert split.events("start")[0]["mesh"] == {"shard": 2, "pp": 2}
    assert "stage 0 of 2: layers 0-1, schedule 1F1B over 2 micro-batches per step (each stage idle 33%" in (
        split.output
    )
    same_curve(reference, split, "llama pipeline 2 1F1B: ")
    # The same run stopped at step 5, resumed on 2 ranks holding every layer (the same 2 data-parallel ranks).
    shutil.copytree(
        tmp_path / "pp2" / "checkpoints" / "step-00000005", tmp_path / "pp1" / "checkpoints" / "step-00000005"
    )
    resumed = _run(tmp_path / "pp1", data, checkpoint, 2)
    assert resumed.events("start")[0]["step"] == 5
    assert "has no state for rank" not in resumed.output  # the exact data position of both data-parallel ranks
    before, after = split.losses(), resumed.losses()
    assert_resumed_curve(before, after)

    # Every stage's tensors under the model's own names: the export loads whole in transformers and
    # gives the logits of the run that finished the same curve with every layer on each rank.
    exported = export_checkpoint(tmp_path / "pp2" / "checkpoints", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    probe = torch.load(resumed.trace_dir / "probe.pt")
    with torch.no_grad():
        logits = hf(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], atol=1e-4, rtol=1e-4)


def test_tied_embeddings_and_more_stages_than_layers_are_refused_in_one_line(
    untied: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    tied = build_checkpoint("qwen2", tmp_path / "qwen2", inputs["tokenizer"])
    message = prepare_error(_config(tmp_path / "t", inputs["aligned"], tied, pipeline=2))
    assert message == (
        "parallelism.pipeline: Qwen2ForCausalLM ties its output head to its input embedding (one weight the first "
        "and the last stage would both update), which this trainer does not split yet; use a model with untied "
        "embeddings (tie_word_embeddings: false) or parallelism.pipeline: 1"
    )
    cfg = _config(tmp_path / "l", inputs["aligned"], untied["mistral"], pipeline=4)
    cfg["training"]["gradAccumSteps"] = 4
    assert prepare_error(cfg) == (
        "parallelism.pipeline: 4 stages need at least 4 decoder layers, and MistralForCausalLM has 2; use "
        "parallelism.pipeline: 2 or fewer"
    )


def test_stages_are_cut_where_the_layers_parameters_are_shared_evenly() -> None:
    assert balanced_ranges([1] * 8, 2) == [range(0, 4), range(4, 8)]
    assert balanced_ranges([1] * 7, 3) == [range(0, 2), range(2, 5), range(5, 7)]
    # A dense first layer (DeepSeek V3) beside heavier MoE layers: the first stage takes one layer more.
    assert balanced_ranges([1, 4, 4, 4], 2) == [range(0, 2), range(2, 4)]
    # Never an empty stage, however uneven.
    assert balanced_ranges([100, 1, 1], 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert idle_share(4, 16) == pytest.approx(3 / 19)


def test_the_trainer_runs_every_schedule_the_api_offers() -> None:
    from typing import get_args

    from fsdp_api.spec.parallelism import PipelineScheduleName
    from fsdp_trainer.step.pipeline import SCHEDULES

    assert list(SCHEDULES) == list(get_args(PipelineScheduleName))
