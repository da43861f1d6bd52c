"""``checkpoint.resumeFrom``: another training's checkpoints to start from while this one has none of its own.

The source is only read: its steps are listed like ``checkpoint.dir``'s (a step
folder, or a checkpoint dir for its newest complete step), checked and loaded
by the same code, and never renamed, pruned or written. Continuing exactly
needs the data the saved position counts in: the source's saved config must
have this training's data section and sequence length, else each difference
is a config line before anything is loaded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.checkpoint_layout import STEP_DIR, complete_checkpoints
from fsdp_api.trainer_config import TrainerConfig

from ..errors import ConfigError
from ..parallel.distributed import WorldInfo, broadcast_object
from .layout import CONFIG_FILE, MARKER

log = logging.getLogger(__name__)

FIELD = "checkpoint.resumeFrom"


def source_candidates(cfg: TrainerConfig, world: WorldInfo) -> list[tuple[int, Path]]:
    """The source's complete steps to resume from, newest first (collective: rank 0 lists, every rank agrees)."""
    source = cfg.checkpoint.resume_from
    assert source is not None
    found: list[tuple[int, Path]] = []
    problems: list[str] = []
    if world.is_main:
        found, problems = _listed(Path(source))
        if found:
            problems = data_differences(cfg, found[0][1])
    found, problems = broadcast_object((found, problems))
    if problems:
        raise ConfigError(problems)
    log.info("%s: no checkpoint of this training in %s yet; starting from %s", FIELD, cfg.checkpoint.dir, found[0][1])
    return found


def _listed(source: Path) -> tuple[list[tuple[int, Path]], list[str]]:
    """(the complete steps at ``source``, newest first; why there are none)."""
    step = STEP_DIR.match(source.name)
    if step is not None:
        if (source / MARKER).is_file():
            return [(int(step.group(1)), source)], []
        why = "does not exist" if not source.exists() else "is not a complete checkpoint (no completion marker)"
        return [], [f"{FIELD}: {source} {why}"]
    if not source.is_dir():
        return [], [f"{FIELD}: {source} does not exist (is the volume that holds it mounted?)"]
    found = complete_checkpoints(source)[::-1]
    if not found:
        return [], [f"{FIELD}: {source} holds no complete checkpoint"]
    return found, []


# What the saved data position counts in: another value of one of these makes it meaningless.
def _position_inputs(config: dict[str, Any]) -> dict[str, Any]:
    return {"data": config.get("data") or {}, "training.seqLen": (config.get("training") or {}).get("seqLen")}


def data_differences(cfg: TrainerConfig, step_dir: Path) -> list[str]:
    """Each difference between the source's data section and seq length and this training's, as a config line."""
    try:
        saved = yaml.safe_load((step_dir / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        return [f"{FIELD}: {step_dir} has no readable {CONFIG_FILE} ({e.__class__.__name__})"]
    theirs, ours = _flat(_position_inputs(saved)), _flat(_position_inputs(cfg.to_dict()))
    return [
        f"{FIELD}: {step_dir.parent} trained with {key}: {_shown(theirs, key)}, this training has "
        f"{_shown(ours, key)}; the saved data position counts in its own data (use its data, or start fresh)"
        for key in sorted(theirs.keys() | ours.keys())
        if theirs.get(key) != ours.get(key)
    ]


def _shown(values: dict[str, Any], key: str) -> str:
    return repr(values[key]) if key in values else "it unset"


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{name}.")
        else:
            out[name] = value
    return out
