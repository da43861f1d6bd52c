"""A few samples from a trained model: a look at its answers without writing a script.

    fsdp-train generate --model HFDIR --prompt "What is FSDP?" [--prompt ...] [--max-new-tokens 64]
    fsdp-train generate --checkpoint /checkpoints --prompts-file prompts.txt --temperature 0.7

``--model`` is a Hugging Face model directory (an ``fsdp-train export``, or any
local one); ``--checkpoint`` is what ``export`` takes (a step, a checkpoint root
for its newest, or an S3 remote tier), exported into a temporary directory
first. With a chat template (the tokenizer's), each prompt is a user turn and
the model answers after the generation prompt; ``--chat off`` sends the text
as it is. Greedy by default (``--temperature 0``), so two runs agree; sampling
takes ``--seed``. One process, on the GPU when there is one, else the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationMixin, PreTrainedTokenizerBase

from .errors import ConfigError, first_line
from .samples import prompt_ids
from .storage import scheme_of

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fsdp-train generate", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a Hugging Face model directory (e.g. an fsdp-train export)")
    source.add_argument("--checkpoint", help="a checkpoint, a checkpoint root or s3://bucket/prefix, as export takes")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts-file", type=Path, help="one prompt per line")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy; above 0: sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's probability mass (with sampling)")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed")
    p.add_argument("--chat", choices=("auto", "on", "off"), default="auto", help="use the chat template (auto: if any)")
    p.add_argument("-o", "--output", choices=("text", "jsonl"), default="text", help="text, or one JSON object a line")
    return p.parse_args(argv)


def prompts_of(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file is not None:
        try:
            prompts += [line for line in args.prompts_file.read_text().splitlines() if line.strip()]
        except OSError as e:
            raise ConfigError([f"--prompts-file: cannot read {args.prompts_file}: {e.strerror or e}"]) from None
    if not prompts:
        raise ConfigError(["--prompt: give at least one prompt (--prompt TEXT or --prompts-file FILE)"])
    return prompts


def check_args(args: argparse.Namespace) -> None:
    problems = []
    if args.max_new_tokens < 1:
        problems.append(f"--max-new-tokens: {args.max_new_tokens} is not a positive number of tokens")
    if args.temperature < 0:
        problems.append(f"--temperature: {args.temperature} is negative")
    if not 0 < args.top_p <= 1:
        problems.append(f"--top-p: {args.top_p} is not in (0, 1]")
    if problems:
        raise ConfigError(problems)


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    if not (model_dir / "config.json").is_file():
        raise ConfigError([f"--model: {model_dir} is not a Hugging Face model directory (no config.json)"])
    try:
        # Code in a model directory never runs (trust_remote_code=False), as everywhere in the trainer.
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ConfigError([f"--model: cannot load the tokenizer of {model_dir}: {first_line(e)}"]) from None


def load_model(model_dir: Path) -> torch.nn.Module:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout holds the samples, stderr one line per problem
    try:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(model_dir), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ConfigError([f"--model: cannot load {model_dir}: {first_line(e)}"]) from None
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
) -> str:
    """The completion of one prompt, decoded without the prompt and without special tokens."""
    assert isinstance(model, GenerationMixin)  # every AutoModelForCausalLM class generates
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    # Greedy unless a temperature is given: then sampling, with that temperature and top-p.
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        # transformers types generate()'s self as a Protocol (written for the ty checker) that, to mypy, its
        # own models do not match: device and dtype are read-only properties there, not variables.
        out = model.generate(  # type: ignore[misc]
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, pad_token_id=pad, **sampling
        )
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence of ids decodes to one string
    return text


def model_dir_of(model: Path | None, checkpoint: str | None, stack: contextlib.ExitStack) -> Path:
    """``--model`` as it is, or ``--checkpoint`` (a step, a root, a remote tier) exported into a temporary
    directory that lives as long as ``stack``: the source of generate and eval."""
    if checkpoint is None:
        assert model is not None  # argparse requires one of the two
        return model
    from .export import export_checkpoint, remote_checkpoint

    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fsdp-export-")))
    local = remote_checkpoint(checkpoint, tmp / "in") if scheme_of(checkpoint) is not None else Path(checkpoint)
    return export_checkpoint(local, tmp / "model")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    check_args(args)
    prompts = prompts_of(args)
    with contextlib.ExitStack() as stack:
        model_dir = model_dir_of(args.model, args.checkpoint, stack)
        tokenizer = load_tokenizer(model_dir)
        # Every prompt checked before the model is loaded: a mistake costs no load.
        inputs = [prompt_ids(tokenizer, prompt, args.chat, "--chat") for prompt in prompts]
        model = load_model(model_dir)
        torch.manual_seed(args.seed)
        for prompt, ids in zip(prompts, inputs, strict=True):
            completion = generate(
                model,
                tokenizer,
                ids,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
            )
            if args.output == "jsonl":
                print(json.dumps({"prompt": prompt, "completion": completion}), flush=True)
            else:
                print(f"### {prompt}\n{completion}\n", flush=True)
    return 0
