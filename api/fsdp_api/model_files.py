"""Checks of a local model directory that need no torch: what ``fsdp-operator validate`` can see.

The API server cannot read a model's config.json at admission, and a hub id
or a PVC path is only reachable from the pod. When ``model.pretrained`` or
``model.architecture`` names a directory on this machine, its config.json
is read as plain JSON and checked; the trainer repeats these checks (and
builds the model) before any process group exists.
"""

from __future__ import annotations

import json
from pathlib import Path

from .spec import FSDPTrainingSpec

# config.json keys that give the longest sequence (transformers' spellings).
MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions")


def local_model_dir(spec: FSDPTrainingSpec) -> tuple[str, Path] | None:
    """(field, directory) when the model reference is a directory on this machine."""
    model = spec.model
    if model is None:
        return None
    field, ref = ("pretrained", model.pretrained) if model.pretrained else ("architecture", model.architecture)
    if not ref:
        return None
    path = Path(ref).expanduser()
    return (f"spec.model.{field}", path) if path.is_dir() else None


def check_local_model(spec: FSDPTrainingSpec) -> list[str]:
    """``field: message`` problems of a local model directory (none when the reference is not local)."""
    found = local_model_dir(spec)
    if found is None:
        return []
    field, path = found
    try:
        config = json.loads((path / "config.json").read_text())
    except OSError:
        return [f"{field}: {path} has no readable config.json (expected a Hugging Face model directory)"]
    except ValueError as e:
        return [f"{field}: {path / 'config.json'} is not valid JSON: {e}"]
    errors = []
    if not isinstance(config, dict) or not config.get("model_type"):
        return [f"{field}: {path / 'config.json'} has no model_type"]
    if config.get("is_encoder_decoder"):
        errors.append(f"{field}: {config['model_type']} is an encoder-decoder model, not a decoder-only causal LM")
    limit = next((int(config[k]) for k in MAX_POSITION_KEYS if isinstance(config.get(k), int)), None)
    seq_len = spec.training.seq_len if spec.training is not None else None
    if limit is not None and seq_len is not None and seq_len > limit:
        errors.append(f"spec.training.seqLen: {seq_len} exceeds the model's maximum sequence length {limit}")
    if field.endswith("pretrained") and not any(path.glob("*.safetensors")):
        errors.append(f"{field}: {path} has no *.safetensors weights")
    return errors
