"""``training.samples``: the sharded model's greedy answers during training, equal to transformers' own generate.

Two FSDP ranks answer two prompts at each validation and at the end; the
answers at the end are those of the exported final checkpoint under
transformers' ``generate`` (greedy), they are on rank 0's log, in the trace
and in TensorBoard as a text table. A prompt set the tokenizer cannot serve is
one config line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_api.contract import TENSORBOARD_SUBDIR
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.trainer.harness import base_config, launch

PROMPTS = ["w1 w2 w3 w4", "w5"]


def _config(work: Path, inputs: dict[str, Path], **samples: Any) -> dict[str, Any]:
    return base_config(
        work,
        inputs["aligned"],
        inputs["tokenizer"],
        training={
            "maxSteps": 6,
            "evalIntervalSteps": 3,
            "evalSteps": 1,
            "samples": {"prompts": PROMPTS, "maxNewTokens": 6, **samples},
        },
        tracking={"tensorboard": {}},
    )


@pytest.mark.slow
def test_two_ranks_answer_at_each_validation_as_transformers_generate_does(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    from fsdp_trainer.export import export_checkpoint
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = launch(tmp_path, _config(tmp_path, inputs)).check()
    events = run.events("samples")
    assert [e["step"] for e in events] == [3, 6]
    answers = {row["prompt"]: row["completion"] for row in events[-1]["samples"]}
    assert list(answers) == PROMPTS

    exported = export_checkpoint(tmp_path / "checkpoints", tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        assert answers[prompt] == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), prompt
    assert any(answers.values()), answers  # not a model that stops at once, which any weights would match

    for prompt, completion in answers.items():
        assert f"sample step 6 | {prompt!r} -> {completion!r}" in run.output
    board = EventAccumulator(str(tmp_path / "checkpoints" / TENSORBOARD_SUBDIR))
    board.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in board.Tensors("samples/text_summary")}
    assert sorted(texts) == [3, 6]
    assert f"| {PROMPTS[1]} | {answers[PROMPTS[1]] or ' '} |" in texts[6]


def test_chat_on_without_a_chat_template_is_one_line(tmp_path: Path, inputs: dict[str, Path]) -> None:
    run = launch(tmp_path, _config(tmp_path, inputs, chat="on"), nproc=None)
    assert run.returncode == 2, run.output
    assert "  training.samples.chat on: the model's tokenizer has no chat template\n" in run.output


def test_a_prompt_whose_answer_would_pass_the_models_longest_sequence_is_one_line(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    # The harness model's maxSeqLen is 128; the prompt is 4 tokens: 124 fit, 125 do not.
    run = launch(tmp_path, _config(tmp_path, inputs, maxNewTokens=125), nproc=None)
    assert run.returncode == 2, run.output
    assert (
        "  training.samples.prompts[0]: 4 tokens and maxNewTokens 125 pass the model's maximum sequence length 128 "
        "(max_position_embeddings): shorten it or lower maxNewTokens\n"
    ) in run.output
