"""``fsdp-train eval``: a model's loss on a data file, as computed by hand; rows kept apart; bad input in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fsdp_trainer.__main__ import main as fsdp_train
from fsdp_trainer.eval_command import main as eval_main
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.trainer.harness import write_ragged_jsonl
from tests.trainer.model.architectures import build_checkpoint

SEQ_LEN = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> Path:
    return build_checkpoint("llama", tmp_path_factory.mktemp("eval") / "llama", inputs["tokenizer"])


def score(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, float]:
    capsys.readouterr()
    assert eval_main([*args, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def hand_loss(model_dir: Path, texts: list[str], seq_len: int) -> tuple[float, int, int]:
    """Every document as <bos> text <eos>, one stream, cut into windows of seq_len + 1; the mean loss of them."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    stream = [
        t for text in texts for t in [tokenizer.bos_token_id, *tokenizer(text)["input_ids"], tokenizer.eos_token_id]
    ]
    count = len(stream) // (seq_len + 1)
    windows = torch.tensor(stream[: count * (seq_len + 1)]).view(count, seq_len + 1)
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits
    total = F.cross_entropy(logits.flatten(0, 1).double(), windows[:, 1:].flatten(), reduction="sum")
    return total.item() / (count * seq_len), count * seq_len, count


def test_the_loss_is_the_mean_next_token_loss_over_every_window(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_ragged_jsonl(tmp_path / "heldout.jsonl", 12)
    texts = [json.loads(line)["text"] for line in data.read_text().splitlines()]
    want, tokens, windows = hand_loss(model_dir, texts, SEQ_LEN)
    got = score(capsys, "--model", str(model_dir), "--data", str(data), "--seq-len", str(SEQ_LEN), "--batch-size", "3")
    assert got["loss"] == pytest.approx(want, abs=1e-5)
    assert (got["tokens"], got["sequences"], got["batches"]) == (tokens, windows, math.ceil(windows / 3))
    assert got["perplexity"] == pytest.approx(math.exp(want), rel=1e-5)
    # --max-batches scores the first batches only.
    first = score(
        capsys,
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--seq-len",
        str(SEQ_LEN),
        "--batch-size",
        "3",
        "--max-batches",
        "1",
    )
    assert (first["sequences"], first["tokens"]) == (3, 3 * SEQ_LEN)


def test_prompt_completion_rows_are_scored_on_their_answers_and_kept_apart(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"prompt": "w1 w2 w3", "completion": "w4 w5 w6 w7"}, {"prompt": "w8 w9", "completion": "w10 w11 w12"}]
    paths = []
    for name, part in (("both", rows), ("first", rows[:1]), ("second", rows[1:])):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in part))
    both, first, second = (
        score(capsys, "--model", str(model_dir), "--data", str(p), "--format", "prompt-completion", "--seq-len", "32")
        for p in paths
    )
    # Packed together, each row's answer is scored as if it were alone: the sums add up.
    assert both["tokens"] == first["tokens"] + second["tokens"] < 12  # the prompts are not scored
    summed = first["loss"] * first["tokens"] + second["loss"] * second["tokens"]
    assert both["loss"] * both["tokens"] == pytest.approx(summed, rel=1e-5)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--data", "/nonexistent.jsonl"], "--data: /nonexistent.jsonl does not exist"),
        (
            ["--data", "s3://bucket/held.jsonl"],
            "--data: s3://bucket/held.jsonl: eval reads local files; copy the data down first",
        ),
        (["--data", "{data}", "--seq-len", "0"], "--seq-len: 0 is not a positive number"),
        (["--data", "{data}", "--seq-len", "40"], "--data: {data} gives no token to score at --seq-len 40 (text)"),
        (["--data", "{data}", "--seq-len", "500"], "--seq-len: 500 is more than the model's 64 positions"),
    ],
)
def test_bad_input_is_one_line(
    args: list[str], line: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "short.jsonl"
    data.write_text(json.dumps({"text": "w1 w2 w3"}) + "\n")
    args = [a.replace("{data}", str(data)) for a in args]
    capsys.readouterr()
    assert fsdp_train(["eval", "--model", str(model_dir), *args]) == 2
    out, err = capsys.readouterr()
    # The trainer's configuration error, as export and generate print it: the header, then the one line.
    assert (out, err) == ("", f"fsdp-train: invalid trainer configuration:\n  {line.replace('{data}', str(data))}\n")
