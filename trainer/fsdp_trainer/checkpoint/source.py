"""``checkpoint.resumeFrom``: another training's checkpoints to start from while this one has none of its own.

The source is only read: its steps are listed like ``checkpoint.dir``'s (a step
folder, or a checkpoint dir for its newest complete step), checked and loaded
by the same code, and never renamed, pruned or written. An ``s3://`` source (a
training's ``checkpoint.remote``, or one step folder under it) is downloaded as
a resume from the remote tier is, by one process per node, into
``<checkpoint.dir>/.resume-from/``: checked against its manifest, used while
the training has no checkpoint of its own, and deleted once it has one.
Continuing exactly
needs the data the saved position counts in: the source's saved config must
have this training's data section and sequence length, else each difference
is a config line before anything is loaded.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.checkpoint_layout import STEP_DIR, complete_checkpoints
from fsdp_api.trainer_config import TrainerConfig

from ..errors import ConfigError, first_line
from ..parallel.distributed import WorldInfo, all_ranks, broadcast_object
from ..storage import StoreError, scheme_of
from .layout import CONFIG_FILE, MARKER, remove_stale
from .remote_store import committed_step_uri, download_committed

log = logging.getLogger(__name__)

FIELD = "checkpoint.resumeFrom"
# Under checkpoint.dir, where an s3:// source's step is downloaded: no step-N name, so never this training's own.
DOWNLOADED = ".resume-from"
_STEP_NAME = "STEP"  # beside the download: which step it is (a source without a step folder: its newest)


def source_candidates(cfg: TrainerConfig, world: WorldInfo) -> list[tuple[int, Path]]:
    """The source's complete steps to resume from, newest first (collective: rank 0 lists, every rank agrees)."""
    source = cfg.checkpoint.resume_from
    assert source is not None
    found: list[tuple[int, Path]] = []
    problems: list[str] = []
    if scheme_of(source) is not None:
        problems = _download(source, Path(cfg.checkpoint.dir) / DOWNLOADED, world)
    if world.is_main and not problems:
        found, problems = _listed(_downloaded(cfg) if scheme_of(source) is not None else Path(source))
        if found:
            problems = data_differences(cfg, found[0][1])
    found, problems = broadcast_object((found, problems))
    if problems:
        raise ConfigError(problems)
    if scheme_of(source) is not None:  # each node reads the copy it downloaded, in its own checkpoint.dir
        found = [(step, Path(cfg.checkpoint.dir) / DOWNLOADED / path.name) for step, path in found]
    log.info("%s: no checkpoint of this training in %s yet; starting from %s", FIELD, cfg.checkpoint.dir, found[0][1])
    return found


def _download(source: str, root: Path, world: WorldInfo) -> list[str]:
    """One process per node downloads the source's step into ``root``; the problem lines (the same on every rank).

    Rank 0 picks the step (a source still training may commit a newer one any
    moment: every node must fetch the same) and clears what an earlier start
    left, before any node writes there (a claim the nodes share is one directory).
    """
    step_uri, problem = None, None
    if world.is_main:
        try:
            step_uri = committed_step_uri(source)
            remove_stale(root)  # a download an earlier start did not finish
        except (ValueError, StoreError) as e:
            problem = f"{FIELD}: {e}"
        except OSError as e:  # the local side: a full disk, a read-only directory
            problem = f"{FIELD}: {source}: {first_line(e)}"
    step_uri, problem = broadcast_object((step_uri, problem))
    if problem is None and world.local_rank == 0:
        assert step_uri is not None
        try:
            chosen = step_uri.rpartition("/")[2]
            for older in root.iterdir() if root.is_dir() else ():  # an earlier start's other step, on this node
                if STEP_DIR.match(older.name) and older.name != chosen:
                    shutil.rmtree(older, ignore_errors=True)
            step = download_committed(step_uri, root)
            (root / _STEP_NAME).write_text(step.name)
        except (ValueError, StoreError) as e:
            problem = f"{FIELD}: {e}"
        except OSError as e:
            problem = f"{FIELD}: {source}: {first_line(e)}"
    if problem:
        log.error("%s", problem)
    if all_ranks(problem is None, world):
        return []
    return [problem or f"{FIELD}: another node could not download {source}"]


def _downloaded(cfg: TrainerConfig) -> Path:
    """The step this node downloaded (its name is written beside it: a source may name no step)."""
    root = Path(cfg.checkpoint.dir) / DOWNLOADED
    return root / (root / _STEP_NAME).read_text()


def forget_downloaded_source(cfg: TrainerConfig, world: WorldInfo) -> None:
    """The training has a checkpoint of its own: a downloaded copy of an s3:// source is no longer read."""
    root = Path(cfg.checkpoint.dir) / DOWNLOADED
    if world.local_rank == 0 and root.is_dir():
        shutil.rmtree(root, ignore_errors=True)
        log.info("%s: removed the downloaded source %s (this training resumes from its own checkpoints)", FIELD, root)


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
