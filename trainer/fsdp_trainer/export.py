"""Export a DCP checkpoint as a Hugging Face model directory, or as a PEFT adapter.

    fsdp-train export --checkpoint DIR --output HFDIR [--dtype bfloat16] [--format merged|peft]

DIR is one checkpoint (``step-00001000/``) or a checkpoint root, in which case
the newest complete checkpoint is used; or an S3 remote tier (``s3://bucket/prefix``, a
training's ``checkpoint.remote``: its newest committed step; or ``.../step-N``), downloaded
and checked against its manifest as a resume does. The output is the model in its own
architecture: its ``config.json`` (``model_type`` and all), ``model.safetensors``
(sharded with an index for large models, in the layout transformers expects
on disk) and the tokenizer files with their chat template, so
``AutoModelForCausalLM`` and ``AutoTokenizer.from_pretrained`` load it.

One process, no process group: DCP reads the sharded files of any world size
straight into the full tensors of a model materialised on the CPU (it needs
host memory for the whole model in fp32, which ``--dtype`` casts tensor by tensor before writing,
plus one tensor).
Optimizer state is not read.

A LoRA checkpoint (``spec.peft``) holds only the adapters. ``--format merged``
(the default) rebuilds the base (``model.pretrained``, or the seeded random
init of a preset/architecture), loads the adapters into it and folds them in
(W + alpha/r * B A), giving a plain model of the base's architecture.
``--format peft`` writes only the adapters as a PEFT adapter directory
(``adapter_config.json`` + ``adapter_model.safetensors``) that
``PeftModel.from_pretrained(base, HFDIR)`` puts on top of the base model.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import warnings
from pathlib import Path

import torch
from fsdp_api.trainer_config import TrainerConfig
from torch.distributed.checkpoint.api import CheckpointException
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from .checkpoint import MARKER, MODEL_CONFIG_DIR, checkpointed_tensors, complete_checkpoints, unpickle
from .checkpoint.saved_config import read_saved_config
from .errors import ConfigError, UnloadableCheckpointError, UnsafeCheckpointError, first_line
from .model.architecture import build_meta_model, materialize, model_dir
from .model.init import init_weights, reset_buffers
from .model.llama import llama_config
from .model.lora import ADAPTER, apply_lora, lora_config, lora_layers, uses_conv1d
from .model.param_names import canonical, is_adapter
from .model.pretrained import check_pretrained, load_pretrained
from .storage import scheme_of

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FORMATS = ("merged", "peft")
# PEFT's file names and key prefix (peft/utils/constants.py, peft/peft_model.py).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def find_checkpoints(path: Path) -> list[Path]:
    """``path`` itself if it is a complete checkpoint, else the complete ones under it, newest first."""
    if (path / MARKER).is_file():
        return [path]
    found = [p for _, p in reversed(complete_checkpoints(path))]
    if not found:
        raise ConfigError([f"--checkpoint: {path} is neither a complete checkpoint nor a directory containing one"])
    return found


def saved_model_config(ckpt: Path, cfg: TrainerConfig, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The architecture the checkpoint was trained with (checkpoints before it was saved: a preset)."""
    if (ckpt / MODEL_CONFIG_DIR / "config.json").is_file():
        return AutoConfig.from_pretrained(ckpt / MODEL_CONFIG_DIR, trust_remote_code=False)
    if cfg.model.preset is None:
        raise ConfigError([f"--checkpoint: {ckpt} lacks {MODEL_CONFIG_DIR}/config.json, the model's architecture"])
    return llama_config(
        cfg.model,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def check_output(output: Path) -> None:
    """Export writes a new directory (or fills an empty one); it never overwrites a model.

    An existing model directory may be what another run reads (a LoRA run's
    ``model.pretrained`` base): overwriting it would lose it silently.
    """
    if output.is_dir() and not any(output.iterdir()):
        return
    if output.exists() or output.is_symlink():
        what = "a directory that is not empty" if output.is_dir() else "a file"
        raise ConfigError([f"--output: {output} is {what}; export never overwrites: give a new or empty directory"])


def export_checkpoint(checkpoint: Path, output: Path, dtype: str = "float32", fmt: str = "merged") -> Path:
    """Write the newest loadable checkpoint under ``checkpoint`` (or that one checkpoint) to ``output``.

    As the trainer's resume does, a checkpoint that cannot be loaded (a
    truncated shard, a damaged file) is skipped for the next older one, with a
    warning; one that is unsafe to read stops the export.
    """
    check_output(output)
    skipped: list[str] = []
    for ckpt in find_checkpoints(checkpoint):
        try:
            model, tokenizer, cfg, targets = _load(ckpt, fmt)
        except (ConfigError, UnsafeCheckpointError):
            raise
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            log.warning("checkpoint %s could not be loaded (%s); trying the next older one", ckpt, first_line(e))
            skipped.append(f"{ckpt.name}: {first_line(e)}")
            continue
        _save(model, tokenizer, cfg, targets, output, dtype, fmt)
        log.info("exported %s to %s (%s, %s)", ckpt, output, fmt, dtype)
        return output
    raise UnloadableCheckpointError(
        f"--checkpoint: nothing under {checkpoint} can be loaded: " + "; ".join(skipped) + "; nothing was written"
    )


def _load(ckpt: Path, fmt: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, TrainerConfig, list[str]]:
    """The model of one checkpoint, materialised on the CPU with its weights (adapters not yet merged)."""
    cfg = read_saved_config(ckpt)
    if fmt == "peft" and cfg.peft is None:
        raise ConfigError([f"--format peft: {ckpt} is a full fine-tuning checkpoint (no peft); use --format merged"])
    if fmt == "peft" and not cfg.model.pretrained:
        field = "preset" if cfg.model.preset else "architecture"
        raise ConfigError(
            [
                f"--format peft: {ckpt} adapts a randomly initialised base (model.{field}), "
                "which PEFT cannot load by name; use --format merged"
            ]
        )
    tokenizer = AutoTokenizer.from_pretrained(ckpt / "tokenizer", trust_remote_code=False)
    model = build_meta_model(saved_model_config(ckpt, cfg, tokenizer))
    targets = apply_lora(model, cfg.peft) if cfg.peft is not None else []
    materialize(model, "cpu")
    reset_buffers(model)  # first: persistent buffers then come from the checkpoint
    if targets:
        _load_base(model, cfg)
    # Same keys as the trainer saved ("model.<parameter name>"); DCP fills the
    # tensors in place and fails on any missing one.
    kept = checkpointed_tensors(model)  # with LoRA: the adapters only
    state = {"model": {k: v for k, v in model.state_dict().items() if canonical(k) in kept}}
    with warnings.catch_warnings():
        # DCP warns that it runs without a process group: that is the point here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        unpickle.load(state, ckpt, no_dist=True)
    return model, tokenizer, cfg, targets


def _save(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: TrainerConfig,
    targets: list[str],
    output: Path,
    dtype: str,
    fmt: str,
) -> None:
    output.mkdir(parents=True, exist_ok=True)
    if fmt == "peft":
        _save_adapter(model, cfg, targets, output, DTYPES[dtype])
    else:
        if targets:
            _merge_adapters(model)
        # transformers wraps PreTrainedModel.to with functools.wraps, which type checkers read as unbound.
        model.to(DTYPES[dtype])  # type: ignore[arg-type]
        model.config.dtype = DTYPES[dtype]
        model.config.use_cache = True  # trained without a KV cache; generation wants one
        model.save_pretrained(output)
    tokenizer.save_pretrained(output)


def _load_base(model: PreTrainedModel, cfg: TrainerConfig) -> None:
    """The frozen base a LoRA run trained on: the pretrained weights, or the run's seeded init."""
    found = model_dir(cfg) if cfg.model.pretrained else None
    if found is None:
        init_weights(model, cfg.training.seed, torch.device("cpu"))
        return
    load_pretrained(model, check_pretrained(model, found[0]), torch.device("cpu"))


@torch.no_grad()
def _merge_adapters(model: torch.nn.Module) -> None:
    """Fold every adapter into its base weight and put the plain layer back (PEFT's merge)."""
    modules = dict(model.named_modules())
    for name, layer in list(lora_layers(model)):
        layer.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child, layer.get_base_layer())


def _save_adapter(
    model: torch.nn.Module, cfg: TrainerConfig, targets: list[str], output: Path, dtype: torch.dtype
) -> None:
    """A PEFT adapter directory: PEFT's key names (no adapter name), its config, safetensors."""
    from safetensors.torch import save_file

    assert cfg.peft is not None
    tensors = {
        PEFT_PREFIX + canonical(k).replace(f".{ADAPTER}.", "."): v.detach().to(dtype).contiguous()
        for k, v in model.state_dict().items()
        if is_adapter(k)
    }
    # The metadata PEFT itself writes: without "format" safetensors' loaders warn.
    save_file(tensors, str(output / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = lora_config(cfg.peft, targets, fan_in_fan_out=uses_conv1d(model, targets), base=cfg.model.pretrained)
    config.save_pretrained(str(output))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsdp-train export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint, or checkpoint.dir for the newest; or checkpoint.remote (s3://bucket/prefix) for its newest "
        "committed step, or s3://bucket/prefix/step-N for that one",
    )
    parser.add_argument(
        "--output", required=True, help="Hugging Face model directory to write, or s3://bucket/prefix (a new prefix)"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the saved weights")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="merged",
        help="merged: a full model (LoRA adapters folded in); peft: a LoRA checkpoint's adapters as a PEFT adapter",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        checkpoint = Path(args.checkpoint)
        if scheme_of(args.checkpoint) is not None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fsdp-export-in-")))
            checkpoint = remote_checkpoint(args.checkpoint, tmp)
        if scheme_of(args.output) is not None:
            print(export_to_store(checkpoint, args.output, args.dtype, args.format))
        else:
            print(export_checkpoint(checkpoint, Path(args.output), args.dtype, args.format))
    return 0


def remote_checkpoint(uri: str, root: Path) -> Path:
    """A committed step of a remote tier (its newest, or the step folder ``uri`` names), downloaded into ``root``."""
    from .checkpoint.remote_store import download_committed
    from .storage import StoreError

    try:
        return download_committed(uri, root)
    except (ValueError, StoreError) as e:
        raise ConfigError([f"--checkpoint: {e}"]) from None
    except OSError as e:  # the local side of the download (a full disk, a read-only directory)
        raise ConfigError([f"--checkpoint: {uri}: {e}"]) from None


def export_to_store(checkpoint: Path, output: str, dtype: str = "float32", fmt: str = "merged") -> str:
    """Export into a temporary directory, then upload it under the new prefix ``output`` (``s3://...``)."""
    from .storage import StoreError, open_store, upload_tree

    try:
        store = open_store(output)
    except ValueError as e:
        raise ConfigError([f"--output: {e}"]) from None
    with tempfile.TemporaryDirectory(prefix="fsdp-export-") as tmp:
        local = export_checkpoint(checkpoint, Path(tmp) / "model", dtype, fmt)
        try:
            sent = upload_tree(local, store)
        except StoreError as e:
            raise ConfigError([f"--output: {e}"]) from None
    log.info("uploaded the export to %s (%.1f MB)", store, sent / 1e6)
    return str(store)
