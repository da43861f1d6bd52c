"""``fsdp-train generate``: a trained model's answers, the same as transformers' own generate; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsdp_trainer.__main__ import main as fsdp_train
from fsdp_trainer.generate import main as generate_main
from fsdp_trainer.samples import prompt_ids
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.trainer.model.architectures import build_checkpoint

PROMPT = "w1 w2 w3 w4"
# A minimal chat template: what the prompt looks like as a user turn, then the generation prompt.
CHAT_TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['content'] }}<eos>{% endfor %}{% if add_generation_prompt %}w9{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> Path:
    return build_checkpoint("llama", tmp_path_factory.mktemp("generate") / "llama", inputs["tokenizer"])


def run(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, str]]:
    assert generate_main([*args, "-o", "jsonl"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_greedy_samples_are_transformers_own(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = run(capsys, "--model", str(model_dir), "--prompt", PROMPT, "--prompt", "w5", "--max-new-tokens", "6")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    expected = []
    for prompt in (PROMPT, "w5"):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        expected.append(
            {"prompt": prompt, "completion": tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)}
        )
    assert got == expected
    assert all(row["completion"].strip() for row in got), got  # six words each, none of them special


def test_sampling_follows_the_seed(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", str(model_dir), "--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "5")
    first, again = run(capsys, *args, "--seed", "1"), run(capsys, *args, "--seed", "1")
    other = run(capsys, *args, "--seed", "2")
    assert first == again and first != other


def test_a_chat_template_makes_the_prompt_a_user_turn(model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plain = prompt_ids(tokenizer, PROMPT, "auto")
    assert plain == tokenizer(PROMPT)["input_ids"]
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = prompt_ids(tokenizer, PROMPT, "auto")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "w1", "w2", "w3", "w4", "<eos>", "w9"]
    assert prompt_ids(tokenizer, PROMPT, "off") == plain


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--model", "{model}"],
            "--prompt: give at least one prompt (--prompt TEXT or --prompts-file FILE)",
        ),
        (
            ["--model", "/nonexistent", "--prompt", "x"],
            "--model: /nonexistent is not a Hugging Face model directory (no config.json)",
        ),
        (
            ["--model", "{model}", "--prompt", "x", "--chat", "on"],
            "--chat on: the model's tokenizer has no chat template",
        ),
        (
            ["--model", "{model}", "--prompt", "x", "--max-new-tokens", "0"],
            "--max-new-tokens: 0 is not a positive number of tokens",
        ),
        (
            ["--checkpoint", "gs://bucket/run", "--prompt", "x"],
            "--checkpoint: 'gs://bucket/run': is not a location of a store the trainer reads (s3://)",
        ),
    ],
    ids=["no-prompt", "not-a-model", "no-template", "zero-tokens", "unknown-store"],
)
def test_bad_input_is_one_line_and_exit_2(
    model_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    code = fsdp_train(["generate", *(a.format(model=model_dir) for a in args)])
    out, err = capsys.readouterr()
    # The trainer's configuration error, as export prints it: the header, then the one line.
    assert (code, out, err) == (2, "", f"fsdp-train: invalid trainer configuration:\n  {line}\n")
