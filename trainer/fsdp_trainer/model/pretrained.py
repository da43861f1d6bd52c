"""Initialising from pretrained Hugging Face weights, streamed into the shards.

``model.pretrained`` names a hub id or a local directory with ``config.json``
and ``*.safetensors`` (one file or an index of shards). The sharded model is
filled tensor by tensor: each rank opens the safetensors files memory-mapped
and reads, for every parameter, only the rows (``get_slice``) that its shard
holds. No rank ever materialises the full model, and the files are read in
place, without a copy on every rank's heap.

The architecture comes from the preset (plus overrides), as for a random
init; the pretrained ``config.json`` must agree with it, which is checked
before any process group exists so a mismatch is a clear config error.
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from fsdp_api.trainer_config import TrainerConfig
from torch import nn

from ..errors import ConfigError
from .hub import local_path, snapshot
from .param_names import unique_parameters
from .shards import local_slices, local_tensor

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
HUB_PATTERNS = ["*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken"]
# config.json key -> (ModelDims attribute, YAML field the user can override)
DIM_KEYS = {
    "hidden_size": ("hidden_size", "hiddenSize"),
    "num_hidden_layers": ("num_layers", "numLayers"),
    "num_attention_heads": ("num_heads", "numHeads"),
    "num_key_value_heads": ("num_key_value_heads", "numKeyValueHeads"),
    "intermediate_size": ("intermediate_size", "intermediateSize"),
    "vocab_size": ("vocab_size", "vocabSize"),
}


def pretrained_dir(ref: str) -> Path:
    """The local directory of ``model.pretrained`` (a hub snapshot for a hub id)."""
    path = local_path(ref)
    if path is not None:
        return path
    try:
        return snapshot(ref, HUB_PATTERNS)
    except Exception as e:  # the hub client raises many kinds; all mean "cannot get it"
        raise ConfigError([f"model.pretrained: cannot fetch {ref} from the Hugging Face hub: {e}"]) from None


def check_pretrained(cfg: TrainerConfig) -> Path | None:
    """Resolve ``model.pretrained`` and check its config.json matches the model; None if unset."""
    if not cfg.model.pretrained:
        return None
    path = pretrained_dir(cfg.model.pretrained)
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError([f"model.pretrained: cannot read {path / 'config.json'}: {e}"]) from None
    dims = cfg.model.dims()
    errors = []
    for key, (attr, field) in DIM_KEYS.items():
        theirs = hf.get(key, hf.get("num_attention_heads") if key == "num_key_value_heads" else None)
        ours = getattr(dims, attr)
        if theirs is not None and int(theirs) != ours:
            errors.append(
                f"model.config.{field}: {cfg.model.pretrained} has {key}={theirs} but preset "
                f"{cfg.model.preset} (with overrides) gives {ours}"
            )
    try:
        if not _weight_files(path):
            errors.append(f"model.pretrained: no safetensors weights in {path}")
    except Exception as e:  # safetensors raises its own error type for corrupt headers
        errors.append(f"model.pretrained: cannot read the safetensors weights in {path}: {e}")
    if errors:
        raise ConfigError(errors)
    return path


def _weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    single = path / WEIGHTS_FILE
    files = [single] if single.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        return {}
    from safetensors import safe_open

    out = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            out.update({name: file for name in f.keys()})  # noqa: SIM118 - safe_open is not a dict
    return out


@torch.no_grad()
def load_pretrained(model: nn.Module, path: Path) -> None:
    """Fill every (sharded) parameter with its piece of the pretrained weights."""
    from safetensors import safe_open

    weights = _weight_files(path)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    missing = []
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for name, param in unique_parameters(model):
            file = weights.get(name)
            if file is None:
                missing.append(name)
                continue
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(str(file), framework="pt"))
            sliced = handles[file].get_slice(name)
            shape = tuple(sliced.get_shape())
            if shape != tuple(param.shape):
                raise ValueError(f"{name}: pretrained shape {shape} does not match the model's {tuple(param.shape)}")
            local = local_tensor(param)
            local.copy_(sliced[local_slices(param)].to(device=local.device, dtype=local.dtype))
    if missing:
        raise ValueError(f"{path} lacks weights for {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    unexpected = set(weights) - {n for n, _ in unique_parameters(model)}
    if tied:
        unexpected.discard("lm_head.weight")
    unexpected = {n for n in unexpected if not n.endswith("rotary_emb.inv_freq")}
    if unexpected:
        log.warning(
            "ignored %d pretrained tensors the model does not have: %s", len(unexpected), sorted(unexpected)[:5]
        )
    log.info("loaded pretrained weights from %s", path)
