"""Loading pretrained Hugging Face weights into the shards, strictly.

``model.pretrained`` names a hub id or a local directory with ``config.json``
and ``*.safetensors`` (one file or an index of shards). Loading is strict:
every tensor of the checkpoint must land in a parameter of the same shape
and every parameter must be filled, or the run stops before training with
one error naming the missing, unexpected and mis-shaped tensors. The only
tensors that may be left over are those transformers itself ignores: a tied
output head and the architecture's ``_keys_to_ignore_on_load_unexpected``.

Two ways in, chosen by ``check_pretrained`` from the safetensors headers:

- ``stream`` (the usual case: the checkpoint's names are the model's): each
  rank opens the files memory-mapped and reads, for every parameter, only the
  rows (``get_slice``) its shard holds. No rank materialises the full model.
- ``convert`` (the checkpoint is stored in another layout that transformers
  converts at load time, e.g. Mixtral's per-expert ``w1/w2/w3`` into fused
  expert tensors): global rank 0 loads it with transformers'
  ``from_pretrained`` on the CPU, which applies the conversion and reports
  what did not match, and broadcasts each full tensor; every rank keeps its
  piece. Rank 0 needs host memory for the whole checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedModel

from ..errors import ConfigError, name_list
from .architecture import embeddings_tied, head_weight_names
from .param_names import base_name, base_parameters
from .shards import copy_full_into, local_slices, local_tensor

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class LoadPlan:
    path: Path
    mode: str  # "stream" or "convert"
    # model name -> (checkpoint name, file) for stream mode
    sources: dict[str, tuple[str, Path]] = field(default_factory=dict)


def tensor_index(path: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Tensor name -> (safetensors file holding it, its shape), reading each file's header once."""
    from safetensors import safe_open

    index = path / INDEX_FILE
    if index.is_file():
        files = sorted({path / file for file in json.loads(index.read_text())["weight_map"].values()})
    else:
        single = path / WEIGHTS_FILE
        files = [single] if single.is_file() else sorted(path.glob("*.safetensors"))
    out: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                out[name] = (file, tuple(f.get_slice(name).get_shape()))
    return out


def _listing(kind: str, names: list[str]) -> str:
    return f"{kind} {name_list(names)}"


def _ignored(model: PreTrainedModel) -> list[re.Pattern[str]]:
    patterns = []
    for module in model.modules():
        for pattern in getattr(module, "_keys_to_ignore_on_load_unexpected", None) or ():
            patterns.append(re.compile(pattern))
    return patterns


def _tied_names(model: PreTrainedModel) -> set[str]:
    return head_weight_names(model) if embeddings_tied(model) else set()


def expected_tensors(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """What a checkpoint must hold: every parameter (tied ones once, LoRA adapters never) and persistent buffer."""
    names = dict(base_parameters(model))
    out = {name: tuple(p.shape) for name, p in names.items()}
    for name, buf in model.state_dict(keep_vars=True).items():
        name = base_name(name)
        if name not in out and not isinstance(buf, nn.Parameter):
            out[name] = tuple(buf.shape)
    return out


def _resolve(name: str, available: dict[str, Any], prefix: str) -> str | None:
    """The checkpoint's name for a model tensor: the same, or without/with the base model prefix."""
    if name in available:
        return name
    if prefix and name.startswith(prefix + "."):
        stripped = name[len(prefix) + 1 :]
        if stripped in available:
            return stripped
    if prefix and f"{prefix}.{name}" in available:
        return f"{prefix}.{name}"
    return None


def _has_conversion(model: PreTrainedModel) -> bool:
    from transformers.conversion_mapping import get_model_conversion_mapping

    try:
        return bool(get_model_conversion_mapping(model, add_legacy=False))
    except Exception:  # an internal helper of transformers: absence means "no conversion"
        return False


def check_pretrained(model: PreTrainedModel, path: Path) -> LoadPlan:
    """Match the checkpoint against the (meta) model by names and shapes; ConfigError if it cannot load."""
    try:
        index = tensor_index(path)
    except Exception as e:  # safetensors raises its own error type for corrupt headers
        raise ConfigError([f"model.pretrained: cannot read the safetensors weights in {path}: {e}"]) from None
    if not index:
        raise ConfigError([f"model.pretrained: no safetensors weights in {path}"])
    shapes = {name: shape for name, (_, shape) in index.items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    params = {name for name, _ in base_parameters(model)}
    expected = expected_tensors(model)
    sources: dict[str, tuple[str, Path]] = {}
    missing, wrong = [], []
    for name, shape in expected.items():
        source = _resolve(name, shapes, prefix)
        if source is None:
            if name in params:
                missing.append(name)
            continue  # a persistent buffer absent from the file keeps its computed value
        if shapes[source] != shape:
            wrong.append(f"{source} {list(shapes[source])} (the model's is {list(shape)})")
        sources[name] = (source, index[source][0])
    used = {source for source, _ in sources.values()}
    ignored = _ignored(model)
    tied = _tied_names(model)
    unexpected = [
        n
        for n in shapes
        if n not in used and _resolve(n, dict.fromkeys(tied), prefix) is None and not any(p.search(n) for p in ignored)
    ]
    if missing and _has_conversion(model) and not wrong:
        log.info("%s is stored in a layout transformers converts at load time; rank 0 converts it", path)
        return LoadPlan(path, "convert")
    errors = []
    if missing:
        errors.append(_listing("missing tensors:", missing))
    if unexpected:
        errors.append(_listing("unexpected tensors:", unexpected))
    if wrong:
        errors.append(_listing("wrong shapes:", wrong))
    if errors:
        raise ConfigError([f"model.pretrained: {path} does not match {type(model).__name__} ({'; '.join(errors)})"])
    return LoadPlan(path, "stream", sources)


@torch.no_grad()
def load_pretrained(model: PreTrainedModel, plan: LoadPlan, device: torch.device) -> None:
    """Fill every (sharded) parameter and persistent buffer with the pretrained values."""
    if plan.mode == "stream":
        _stream(model, plan)
    else:
        _convert_on_rank0(model, plan, device)
    log.info("loaded pretrained weights from %s (%s)", plan.path, plan.mode)


def _targets(model: nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = dict(base_parameters(model))
    for name, buf in model.named_buffers():
        out.setdefault(base_name(name), buf)
    return out


def _stream(model: nn.Module, plan: LoadPlan) -> None:
    from safetensors import safe_open

    targets = _targets(model)
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for name, (source, file) in plan.sources.items():
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(str(file), framework="pt"))
            if (target := targets.get(name)) is None:
                continue  # another pipeline stage's tensor
            local = local_tensor(target)
            piece = handles[file].get_slice(source)[local_slices(target)]
            local.copy_(piece.to(device=local.device, dtype=local.dtype))


def _convert_on_rank0(model: PreTrainedModel, plan: LoadPlan, device: torch.device) -> None:
    if not dist.is_initialized():  # one process (export): nothing to broadcast
        reference, errors = _load_with_transformers(plan.path)
        if errors:
            raise ConfigError(errors)
        for name, target in _targets(model).items():
            if name in reference:
                copy_full_into(target, reference.pop(name).to(dtype=torch.float32))
        return
    reference = {}
    errors = []
    if dist.get_rank() == 0:
        reference, errors = _load_with_transformers(plan.path)
    box: list[Any] = [errors]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise ConfigError(box[0])
    targets = _targets(model)
    # Every tensor of the checkpoint, with its shape: under pipelining rank 0 (the first stage) does not
    # hold the later stages' tensors, and each rank keeps only what it holds.
    names = [(n, tuple(t.shape)) for n, t in reference.items()] if dist.get_rank() == 0 else []
    box = [names]
    dist.broadcast_object_list(box, src=0)
    # gloo broadcasts CPU tensors, NCCL device tensors.
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    for name, shape in box[0]:
        held = targets.get(name)
        if dist.get_rank() == 0:
            full = reference.pop(name).to(device=where, dtype=torch.float32)
        else:
            full = torch.empty(shape, device=where, dtype=torch.float32)
        dist.broadcast(full, src=0)
        if held is not None:
            copy_full_into(held, full)
        del full


def _load_with_transformers(path: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        # With output_loading_info, (the model, its loading report); transformers types the model alone.
        reference, info = cast(
            tuple[PreTrainedModel, dict[str, Any]],
            AutoModelForCausalLM.from_pretrained(path, dtype="auto", output_loading_info=True, trust_remote_code=False),
        )
    except Exception as e:  # mismatched sizes and corrupt files raise; report, do not crash every rank
        return {}, [f"model.pretrained: transformers cannot load {path}: {e}"]
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        names = [str(n) for n in info.get(kind) or ()]
        if names:
            problems.append(_listing(kind.replace("_keys", " tensors:"), names))
    if problems:
        name = type(reference).__name__
        return {}, [f"model.pretrained: {path} does not match {name} ({'; '.join(problems)})"]
    state = {base_name(n): t for n, t in reference.state_dict().items()}
    return state, []
