"""Whether a checkpoint can be resumed into this run's model: tensor names and shapes, LoRA settings.

Read from DCP's metadata and the saved config only (no tensor data), so
every candidate is checked before anything is materialised.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_api.spec import PeftSpec
from fsdp_api.trainer_config import TrainerConfig
from torch import nn

from ..errors import ConfigError, UnsafeCheckpointError, first_line, name_list
from ..parallel.distributed import WorldInfo, all_ranks
from .layout import CONFIG_FILE, complete_checkpoints
from .state import MODEL_KEY, checkpointed_tensors
from .unpickle import saved_metadata

log = logging.getLogger(__name__)


def _saved_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The model tensors of a checkpoint and their full shapes, from DCP's metadata (no data read)."""
    metadata = saved_metadata(path).state_dict_metadata
    prefix = f"{MODEL_KEY}."
    return {
        key[len(prefix) :]: tuple(meta.size)
        for key, meta in metadata.items()
        if key.startswith(prefix) and hasattr(meta, "size")
    }


def architecture_changes(saved: dict[str, tuple[int, ...]], model: nn.Module) -> list[str]:
    """What differs between a checkpoint's model tensors and this model's (names and shapes)."""
    current = checkpointed_tensors(model)
    changes = []
    if gone := [n for n in saved if n not in current]:
        changes.append(f"the checkpoint has tensors this model lacks: {name_list(gone)}")
    if new := [n for n in current if n not in saved]:
        changes.append(f"this model has tensors the checkpoint lacks: {name_list(new)}")
    if reshaped := [
        f"{n} {list(saved[n])} -> {list(current[n])}" for n in current if n in saved and saved[n] != current[n]
    ]:
        changes.append(f"shapes differ: {name_list(reshaped)}")
    return changes


class _Unreadable(Exception):
    """A checkpoint's own files cannot be read (not a config problem): try an older one."""


def _peft_of(path: Path) -> tuple[bool, dict[str, Any] | None]:
    """(whether the checkpoint's config could be read, its ``peft`` section)."""
    try:
        saved = TrainerConfig.from_yaml((path / CONFIG_FILE).read_text())
    except Exception:  # absent or unreadable: the tensor check below still guards the resume
        return False, None
    return True, saved.peft.model_dump(by_alias=True, mode="json") if saved.peft else None


def peft_changes(path: Path, peft: PeftSpec | None) -> list[str]:
    """How the checkpoint's LoRA settings differ from this run's (alpha and dropout change no shape)."""
    known, saved = _peft_of(path)
    current = peft.model_dump(by_alias=True, mode="json") if peft else None
    if not known or saved == current:
        return []
    if saved is None or current is None:
        before, now = ("full fine-tuning", "LoRA") if saved is None else ("LoRA", "full fine-tuning")
        return [f"peft: the checkpoint was trained with {before}, this run uses {now}"]
    return [
        f"peft.{key}: the checkpoint was trained with {saved.get(key)!r}, this run has {current.get(key)!r}"
        for key in sorted(set(saved) | set(current))
        if saved.get(key) != current.get(key)
    ]


def check_resumable(path: Path, model: nn.Module, peft: PeftSpec | None = None) -> None:
    """Refuse to resume ``path`` into a model of another architecture (``model``: the meta model).

    DCP loads what it finds by name: with fewer layers it would drop the rest
    and train on, silently. Learning rate, steps, batch settings and the
    sharding strategy may change; the model's tensors may not, nor the LoRA
    settings (``peft``), some of which (alpha, dropout) no tensor shape shows.
    """
    try:
        saved = _saved_shapes(path)
    except UnsafeCheckpointError:
        raise  # an attack, not damage: the run stops (older checkpoints are no safer)
    except Exception as e:  # a truncated or garbage .metadata raises pickle, EOF, OS or value errors
        raise _Unreadable(f"cannot read its metadata: {first_line(e)}") from None
    changes = peft_changes(path, peft) or architecture_changes(saved, model)
    if changes:
        raise ConfigError(
            [f"model: {change} (checkpoint {path} holds another architecture)" for change in changes]
            + [
                "checkpoint.dir: resuming needs the checkpoint's architecture; restore it, or start fresh "
                "with checkpoint.resume: never or another checkpoint.dir"
            ]
        )


@dataclass(frozen=True)
class Skipped:
    """A checkpoint resume passed over, and why."""

    step: int
    path: Path
    reason: str


def check_candidates(
    candidates: list[tuple[int, Path]], model: nn.Module, world: WorldInfo, peft: PeftSpec | None = None
) -> tuple[list[tuple[int, Path]], list[Skipped]]:
    """Check every candidate's metadata against ``model`` (the meta model): (loadable ones, unreadable ones).

    Reading metadata is cheap (no tensor data), so all are checked before
    anything is materialised. The newest readable one of another
    architecture is a config error (ConfigError): an older checkpoint would
    not fix that. Older ones of another architecture (from before a fresh
    start in the same directory) are never loaded. All ranks read and agree.
    """
    usable: list[tuple[int, Path]] = []
    unreadable: list[Skipped] = []
    for step, path in candidates:
        reason, changed = None, None
        try:
            check_resumable(path, model, peft)
        except _Unreadable as e:
            reason = str(e)
        except ConfigError as e:
            changed = e
        if not all_ranks(reason is None, world):
            unreadable.append(Skipped(step, path, reason or "another rank cannot read its metadata"))
        elif changed is not None:
            if not usable:
                raise changed
            log.warning("checkpoint %s holds another architecture; it is never loaded", path)
        else:
            usable.append((step, path))
    return usable, unreadable


def resume_problems(root: Path, model: nn.Module, peft: PeftSpec | None = None) -> list[str]:
    """What the ranks would refuse to resume, read once by the config check before torchrun.

    The same reading as ``check_candidates`` without a process group: the
    newest checkpoint whose metadata can be read decides (unreadable ones are
    passed over there too). An unsafe one raises UnsafeCheckpointError.
    """
    for _, path in reversed(complete_checkpoints(root)):
        try:
            check_resumable(path, model, peft)
        except _Unreadable:
            continue
        except ConfigError as e:
            return list(e.lines)
        return []
    return []
