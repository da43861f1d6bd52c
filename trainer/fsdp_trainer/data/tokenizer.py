"""Tokenizers: any Hugging Face tokenizer, or the one the project builds offline.

``data.tokenizer`` (a hub id or a local directory) is loaded with
``AutoTokenizer``; unset, the pretrained model's tokenizer is used; with
neither, the embedded tokenizer: a byte-level BPE with a 4096-token
vocabulary (the tiny preset's), trained with the ``tokenizers`` library on the
embedded corpus (``corpus.py``) and shipped in the package's ``assets/tokenizer``.
``python -m fsdp_trainer.data.tokenizer OUTPUT_DIR`` rebuilds it; if the asset is
missing the trainer builds it into the user cache on first use.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from fsdp_api.trainer_config import TrainerConfig
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..errors import ConfigError, load_failure
from .formats import data_format

log = logging.getLogger(__name__)

EMBEDDED_VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
ASSET_DIR = Path(__file__).parents[1] / "assets" / "tokenizer"


def build_bpe_tokenizer(documents: Iterable[str], vocab_size: int = EMBEDDED_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style: any byte sequence encodes, no unknown token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def build_embedded_tokenizer(output: Path) -> Path:
    """Build the embedded tokenizer into ``output`` atomically (concurrent ranks may race)."""
    from .corpus import embedded_documents

    output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_bpe_tokenizer(embedded_documents())
    tmp = Path(tempfile.mkdtemp(prefix=output.name + ".tmp-", dir=output.parent))
    tokenizer.save_pretrained(tmp)
    tmp.chmod(0o755)  # mkdtemp makes it private; the asset and cache are shared
    try:
        tmp.rename(output)
    except OSError:
        # Another process finished first; its copy is identical.
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return output


def embedded_tokenizer_dir() -> Path:
    if (ASSET_DIR / "tokenizer.json").is_file():
        return ASSET_DIR
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdp-k8s" / "tokenizer-bpe4096"
    if not (cache / "tokenizer.json").is_file():
        log.info("building the embedded tokenizer into %s", cache)
        build_embedded_tokenizer(cache)
    return cache


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def tokenizer_source(cfg: TrainerConfig, model_path: Path | None = None) -> tuple[str, str]:
    """(where to load from, which config field said so).

    ``model_path`` is the directory of model.pretrained or model.architecture
    (a hub snapshot for a hub id): its tokenizer is used when it ships one.
    """
    if cfg.data.tokenizer:
        return cfg.data.tokenizer, "data.tokenizer"
    if cfg.model.pretrained:
        return str(model_path or cfg.model.pretrained), "model.pretrained"
    if model_path is not None and any((model_path / f).is_file() for f in TOKENIZER_FILES):
        return str(model_path), "model.architecture"
    return str(embedded_tokenizer_dir()), "data.tokenizer"


def load_tokenizer(cfg: TrainerConfig, model_path: Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer (before any process group); ``check_vocabulary`` compares it with the model."""
    ref, field = tokenizer_source(cfg, model_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref, trust_remote_code=False)  # never the prompt to run code
    except (OSError, ValueError) as e:
        raise ConfigError([f"{field}: cannot load a tokenizer from {ref}: {load_failure(e)}"]) from None
    if tokenizer.eos_token_id is None:
        raise ConfigError([f"{field}: the tokenizer ({ref}) has no end-of-text token to separate documents"])
    problem = data_format(cfg.data.format).check_tokenizer(tokenizer, ref, field)
    if problem:
        raise ConfigError([problem])
    return tokenizer


def check_vocabulary(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, cfg: TrainerConfig, model_path: Path | None = None
) -> None:
    """Every token id must index the model's embedding; the error names the setting that chose each side."""
    if len(tokenizer) <= vocab_size:
        return
    ref, field = tokenizer_source(cfg, model_path)
    tokens = (
        f"the tokenizer ({ref}, from {field}) has {len(tokenizer)} tokens but the model's vocabulary is {vocab_size}"
    )
    if not cfg.model.pretrained:
        line = f"model.config.vocabSize: {tokens}; raise vocabSize to at least {len(tokenizer)}"
    elif field == "data.tokenizer":
        line = f"data.tokenizer: {tokens}; use the model's own tokenizer (unset data.tokenizer)"
    else:
        line = (
            f"model.pretrained: {tokens}: the directory's tokenizer and config.json do not belong together; "
            f"fix the directory, or set data.tokenizer to one with at most {vocab_size} tokens"
        )
    raise ConfigError([line])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the embedded byte-level BPE tokenizer.")
    parser.add_argument("output", type=Path, nargs="?", default=ASSET_DIR)
    args = parser.parse_args(argv)
    if args.output.exists():
        import shutil

        shutil.rmtree(args.output)
    build_embedded_tokenizer(args.output)
    print(args.output)


if __name__ == "__main__":
    main()
