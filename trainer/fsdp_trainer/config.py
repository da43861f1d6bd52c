"""Loading the trainer's config and checking it against the launch, before any process group.

The config is the API package's ``TrainerConfig`` (``fsdp_api.trainer_config``):
train.yaml, which the operator renders into the job's ConfigMap and
``run-local`` writes beside the run. Command-line overrides use the YAML field names in kebab case,
``--training.max-steps 20`` for ``training.maxSteps``, and go through the same
pydantic validation, so an override is checked exactly like ``kubectl apply``.

The checks here need the launch (world size) or the filesystem, which the API
server cannot see. They all run before ``init_process_group``: a bad config
fails on every rank with the same message instead of hanging a rendezvous.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from fsdp_api import kubeyaml
from fsdp_api.parallel_plan import ParallelPlan
from fsdp_api.rules import format_errors
from fsdp_api.trainer_config import TrainerConfig
from pydantic import ValidationError

from .data import files
from .data.formats import data_format
from .errors import ConfigError
from .model import hub
from .model.hub import local_path


def _camel(kebab: str) -> str:
    head, *rest = kebab.replace("_", "-").split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--training.max-steps", "20", "--fsdp.cpu-offload=true"]`` -> nested camelCase dict.

    Values are parsed as YAML scalars, so ``20`` is an int, ``true`` a bool and
    ``null`` clears a field.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg:
            raise ConfigError([f"{arg}: overrides look like --section.field-name value"])
        key, sep, value = arg[2:].partition("=")
        if not sep:
            if i + 1 >= len(args):
                raise ConfigError([f"{arg}: missing value"])
            value = args[i + 1]
            i += 1
        i += 1
        parts = [_camel(p) for p in key.split(".")]
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError([f"{key}: conflicts with another override"])
        node[parts[-1]] = kubeyaml.load(value) if value != "" else ""
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> TrainerConfig:
    """train.yaml plus overrides, validated by the API model."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError([f"--config: cannot read {path}: {e.strerror}"]) from e
    data = kubeyaml.load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError([f"--config: {path} is not a YAML mapping"])
    data = _merge(data, parse_overrides(overrides or []))
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e, model=TrainerConfig)) from None


def check_config(cfg: TrainerConfig, plan: ParallelPlan, device_type: str = "cuda") -> None:
    """Everything that can be known wrong before training starts; raises ConfigError naming fields."""
    errors: list[str] = []
    errors += plan.errors()
    if cfg.fsdp.cpu_offload and device_type != "cuda":
        errors.append("fsdp.cpuOffload: needs GPUs; without them the parameters already live in CPU memory")
    errors += _check_float8(cfg, device_type)
    errors += _check_data(cfg)
    errors += _check_model_refs(cfg)
    errors += _check_checkpoint_dir(cfg)
    if errors:
        raise ConfigError(errors)
    _check_hub_reachable(cfg)


def _check_float8(cfg: TrainerConfig, device_type: str) -> list[str]:
    if cfg.training.precision != "float8":
        return []
    if importlib.util.find_spec("torchao") is None:
        return ["training.precision: float8 needs torchao, which this environment lacks (pip install torchao)"]
    import torch  # here: the config check itself runs without torch's import time

    if device_type == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
        if capability < (8, 9):
            name = torch.cuda.get_device_name()
            return [
                f"training.precision: float8 needs float8 tensor cores (compute capability 8.9 or later: H100, "
                f"H200, L4, L40S); this GPU is {name}, {capability[0]}.{capability[1]}: use bf16"
            ]
    return []


def hub_refs(cfg: TrainerConfig) -> list[tuple[str, str]]:
    """(field, hub id) of every reference the run fetches from the Hugging Face hub."""
    refs = [
        ("model.pretrained", cfg.model.pretrained),
        ("model.architecture", cfg.model.architecture),
        ("data.tokenizer", cfg.data.tokenizer),
        ("data.dataset", cfg.data.dataset),
    ]
    return [(field, ref) for field, ref in refs if ref and local_path(ref) is None]


def _check_hub_reachable(cfg: TrainerConfig) -> None:
    """One bounded request before any download: without a network the run stops in one line, at once."""
    refs = hub_refs(cfg)
    if not refs or hub.hub_offline():
        return
    reason = hub.hub_unreachable()
    if reason is None:
        return
    raise ConfigError(
        [
            f"{field}: cannot fetch {ref}: the Hugging Face hub ({hub.hub_endpoint()}) did not answer within "
            f"{hub.HUB_PROBE_SECONDS:g} s ({reason}); give a local path (a volume), or fill HF_HOME beforehand "
            "and set HF_HUB_OFFLINE=1"
            for field, ref in refs
        ]
    )


def _check_data(cfg: TrainerConfig) -> list[str]:
    errors = []
    data = cfg.data
    if data.path:
        try:
            found = files.resolve(data.path)
        except files.DataFilesError as e:
            errors.append(f"data.path: {e}")
        else:
            errors += data_format(data.format).check_files(data, found)
        if data.validation_split:
            errors.append(
                "data.validationSplit: only for hub datasets (data.dataset); "
                "local files use a held-out slice of the documents"
            )
    if data.dataset:
        path = local_path(data.dataset)
        if path is not None and not path.exists():
            errors.append(f"data.dataset: {data.dataset} does not exist (a local dataset directory or a hub id)")
    if data.validation_split and data.validation_split == data.split:
        errors.append("data.validationSplit: must differ from data.split, or validation would measure training data")
    if data.tokenizer:
        path = local_path(data.tokenizer)
        if path is not None and not path.is_dir():
            errors.append(f"data.tokenizer: {data.tokenizer} is not a directory with tokenizer files")
    return errors


def _check_model_refs(cfg: TrainerConfig) -> list[str]:
    ref = cfg.model.pretrained
    if not ref:
        return []
    path = local_path(ref)
    if path is None:
        return []
    if not (path / "config.json").is_file():
        return [f"model.pretrained: {ref} has no config.json (expected a Hugging Face model directory)"]
    if not any(path.glob("*.safetensors")):
        return [f"model.pretrained: {ref} has no *.safetensors weights"]
    return []


def _check_checkpoint_dir(cfg: TrainerConfig) -> list[str]:
    ckpt = Path(cfg.checkpoint.dir)
    try:
        ckpt.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return [f"checkpoint.dir: cannot create {ckpt}: {e.strerror}"]
    if not os.access(ckpt, os.W_OK):
        return [f"checkpoint.dir: {ckpt} is not writable"]
    return []
