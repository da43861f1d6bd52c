"""Export a DCP checkpoint as a Hugging Face model directory.

    fsdp-train export --checkpoint DIR --output HFDIR [--dtype bfloat16]

DIR is one checkpoint (``step-00001000/``) or a checkpoint root, in which case
the newest complete checkpoint is used. The output is the model in its own
architecture: its ``config.json`` (``model_type`` and all), ``model.safetensors``
(sharded with an index for large models, in the layout transformers expects
on disk) and the tokenizer files with their chat template, so
``AutoModelForCausalLM`` and ``AutoTokenizer.from_pretrained`` load it.

One process, no process group: DCP reads the sharded files of any world size
straight into the full tensors of a model materialised on the CPU (it needs
host memory for the whole model in the chosen dtype, plus one tensor).
Optimizer state is not read.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from fsdp_api.trainer_config import TrainerConfig
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from .checkpoint import CONFIG_FILE, MARKER, MODEL_CONFIG_DIR, latest_checkpoint
from .errors import ConfigError
from .model.architecture import build_meta_model, materialize
from .model.init import reset_buffers
from .model.llama import llama_config

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def find_checkpoint(path: Path) -> Path:
    if (path / MARKER).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise ConfigError([f"--checkpoint: {path} is neither a complete checkpoint nor a directory containing one"])
    return latest[1]


def saved_model_config(ckpt: Path, cfg: TrainerConfig, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The architecture the checkpoint was trained with (checkpoints before it was saved: a preset)."""
    if (ckpt / MODEL_CONFIG_DIR / "config.json").is_file():
        return AutoConfig.from_pretrained(ckpt / MODEL_CONFIG_DIR)
    if cfg.model.preset is None:
        raise ConfigError([f"--checkpoint: {ckpt} lacks {MODEL_CONFIG_DIR}/config.json, the model's architecture"])
    return llama_config(
        cfg.model,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def export_checkpoint(checkpoint: Path, output: Path, dtype: str = "float32") -> Path:
    ckpt = find_checkpoint(checkpoint)
    cfg = TrainerConfig.from_yaml((ckpt / CONFIG_FILE).read_text())
    tokenizer = AutoTokenizer.from_pretrained(ckpt / "tokenizer")
    model = build_meta_model(saved_model_config(ckpt, cfg, tokenizer))
    materialize(model, "cpu")
    reset_buffers(model)  # first: persistent buffers then come from the checkpoint
    # Same keys as the trainer saved ("model.<parameter name>"); DCP fills the
    # tensors in place and fails on any missing one.
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        # DCP warns that it runs without a process group: that is the point here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
    model.to(DTYPES[dtype])
    model.config.dtype = DTYPES[dtype]
    model.config.use_cache = True  # trained without a KV cache; generation wants one
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    log.info("exported %s to %s (%s)", ckpt, output, dtype)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsdp-train export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint, or checkpoint.dir for the newest")
    parser.add_argument("--output", type=Path, required=True, help="Hugging Face model directory to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the saved weights")
    args = parser.parse_args(argv)
    print(export_checkpoint(args.checkpoint, args.output, args.dtype))
    return 0
