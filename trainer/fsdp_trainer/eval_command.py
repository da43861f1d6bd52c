"""``fsdp-train eval``: a trained model's loss and perplexity on a data file, without writing a script.

    fsdp-train eval --checkpoint /checkpoints --data heldout.jsonl
    fsdp-train eval --model ./hf-model --data chats.jsonl --format chat --seq-len 1024 -o json

``--model`` and ``--checkpoint`` are what ``generate`` takes (a checkpoint is
exported into a temporary directory first). Every row of ``--data`` is read in
stored order and made into sequences as the training makes them for its
format (text: windows of ``--seq-len`` tokens over the whole stream; chat and
prompt-completion: whole rows packed, only the answers scored, the rows kept
apart). The loss is the mean next-token cross-entropy over every scored
token, in fp32, as the training's own validation computes it; the perplexity
is its exponential. One process, on the GPU when there is one, else the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from fsdp_api.spec import DataSpec
from pydantic import ValidationError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .data.attention import PackedAttention
from .data.formats import data_format
from .data.loader import every_batch
from .errors import ConfigError, first_line
from .loss import ModelCall, token_loss_sum
from .storage import scheme_of

# The formats whose loss is a token loss; a preference file's loss is its pairs' (the dpo objective's).
TOKEN_FORMATS = ("text", "chat", "prompt-completion")
# The whole file is scored unless --max-batches says otherwise.
ALL_BATCHES = 2**31


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fsdp-train eval", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a Hugging Face model directory (e.g. an fsdp-train export)")
    source.add_argument("--checkpoint", help="a checkpoint, a checkpoint root or s3://bucket/prefix, as export takes")
    p.add_argument("--data", required=True, help="a json/jsonl/parquet/csv/txt file or a folder of them")
    p.add_argument("--format", choices=TOKEN_FORMATS, default="text", help="the rows' format, as data.format")
    p.add_argument("--text-field", default="text", help="format text: the column of the text (default text)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (default 1024)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per forward (default 4)")
    p.add_argument("--max-batches", type=int, help="score at most this many batches (default: the whole file)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="a line of text, or JSON")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    problems = []
    for flag, value in (("--seq-len", args.seq_len), ("--batch-size", args.batch_size)):
        if value < 1:
            problems.append(f"{flag}: {value} is not a positive number")
    if args.max_batches is not None and args.max_batches < 1:
        problems.append(f"--max-batches: {args.max_batches} is not a positive number")
    if scheme_of(args.data) is not None:
        problems.append(f"--data: {args.data}: eval reads local files; copy the data down first")
    elif not Path(args.data).exists():
        problems.append(f"--data: {args.data} does not exist")
    return problems


def data_spec(args: argparse.Namespace) -> DataSpec:
    """The file as a data section: every row of it is the validation split."""
    try:
        return DataSpec.model_validate(
            {"path": args.data, "format": args.format, "textField": args.text_field, "validationSplit": "train"}
        )
    except ValidationError as e:
        raise ConfigError([f"--data: {first_line(e)}"]) from None


@dataclass(frozen=True)
class Score:
    """The mean loss over ``tokens`` scored tokens of ``sequences`` sequences."""

    loss: float
    tokens: int
    sequences: int
    batches: int

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    def line(self, data: str) -> str:
        return (
            f"loss {self.loss:.4f} · perplexity {self.perplexity:.4g} · {self.tokens:,} tokens scored in "
            f"{self.sequences:,} sequences of {data}"
        )

    def record(self) -> dict[str, float | int]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "sequences": self.sequences,
            "batches": self.batches,
        }


@torch.no_grad()
def score(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, spec: DataSpec, args: argparse.Namespace
) -> Score:
    """The model's summed loss over every scored token of the file's sequences, and what it is a mean over."""
    seq_len, positions = args.seq_len, max_positions(model)
    if seq_len > positions:
        raise ConfigError([f"--seq-len: {seq_len} is more than the model's {positions} positions"])
    batches = every_batch(
        spec, tokenizer, seq_len=seq_len, batch_size=args.batch_size, max_batches=args.max_batches or ALL_BATCHES
    )
    packed = PackedAttention(model, seq_len) if data_format(spec.format).packs_documents else None
    device = next(model.parameters()).device
    total, tokens, sequences = 0.0, 0, 0
    for batch in batches:
        batch = batch.to(device)
        attention = {} if packed is None else packed.kwargs(batch.position_ids)
        logits = ModelCall(model, {"input_ids": batch.inputs, **attention})().logits
        total += token_loss_sum(logits, batch.labels).double().item()
        tokens += batch.num_trained
        sequences += batch.inputs.shape[0]
    if tokens == 0:
        raise ConfigError([f"--data: {args.data} gives no token to score at --seq-len {seq_len} ({args.format})"])
    return Score(total / tokens, tokens, sequences, len(batches))


def max_positions(model: PreTrainedModel) -> int:
    """The longest sequence the model takes (its config's positions; unbounded without one)."""
    config = model.config.get_text_config()
    return int(getattr(config, "max_position_embeddings", None) or 2**31)


def main(argv: list[str] | None = None) -> int:
    from .generate import load_model, load_tokenizer, model_dir_of

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    problems = check_args(args)
    if problems:
        raise ConfigError(problems)
    spec = data_spec(args)
    import datasets

    datasets.disable_progress_bars()  # stdout holds the score, stderr one line per problem
    with contextlib.ExitStack() as stack:
        model_dir = model_dir_of(args.model, args.checkpoint, stack)
        tokenizer = load_tokenizer(model_dir)
        model = load_model(model_dir)
        assert isinstance(model, PreTrainedModel)  # every AutoModelForCausalLM class is one
        result = score(model, tokenizer, spec, args)
    print(json.dumps(result.record()) if args.output == "json" else result.line(args.data), flush=True)
    return 0
