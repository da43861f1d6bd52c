"""Where checkpoints live in ``checkpoint.dir``: names, listing, the atomic commit.

Layout of ``checkpoint.dir``::

    step-00000500/            a complete checkpoint
      .metadata, __*.distcp   DCP: model + optimizer (sharded), step
      ranks/rank-00000.pt     per-rank: data position, RNG states
      trainer_config.yaml     the config the run used (for export)
      tokenizer/              the tokenizer (for export)
      COMPLETE                marker, written last (JSON: step, world size, time)
    step-00001000.tmp-<id>/   a save in progress, or one a crash interrupted
    step-00000250.unloadable/ a checkpoint resume could not load, set aside

A save writes everything into ``step-N.tmp-<id>/``; ``commit`` writes
``COMPLETE`` and renames the directory to ``step-N/`` (a rename is atomic on
POSIX filesystems, EFS/FSx included). Listing only counts ``step-N/``
directories with the marker, so a save interrupted at any point is never
loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

# The step folders are the API package's (run-local reads them without torch); re-exported here.
from fsdp_api.checkpoint_layout import STEP_DIR as STEP_DIR
from fsdp_api.checkpoint_layout import complete_checkpoints as complete_checkpoints
from fsdp_api.checkpoint_layout import step_dir_name as step_dir_name
from fsdp_api.contract import CHECKPOINT_COMPLETE_MARKER, CHECKPOINT_DIR_PREFIX

MARKER = CHECKPOINT_COMPLETE_MARKER
_PREFIX = re.escape(CHECKPOINT_DIR_PREFIX)
# An unfinished save: ``<step dir>`` + TMP_INFIX + a random id.
TMP_INFIX = ".tmp-"
TMP_DIR = re.compile(rf"^{_PREFIX}(\d{{8}}){re.escape(TMP_INFIX)}")
RANKS_DIR = "ranks"
# The run's config, saved in every checkpoint (export and the resume check read it).
CONFIG_FILE = "trainer_config.yaml"
# The model's transformers config.json, saved beside it: export rebuilds the architecture from it.
MODEL_CONFIG_DIR = "model_config"


def new_tmp_dir(final: Path) -> Path:
    """A fresh directory name for a save of ``final`` that is not complete yet."""
    return Path(f"{final}{TMP_INFIX}{uuid.uuid4().hex[:8]}")


def rank_file(ckpt: Path, rank: int) -> Path:
    """This rank's own state (data position, RNG) in checkpoint ``ckpt``."""
    return ckpt / RANKS_DIR / f"rank-{rank:05d}.pt"


def latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def remove_stale(root: Path) -> list[Path]:
    """Delete interrupted saves (``.tmp-`` directories); returns what was removed."""
    removed = []
    if root.is_dir():
        for entry in root.iterdir():
            if TMP_DIR.match(entry.name) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def remove_partial(tmp: Path) -> bool:
    """Delete an unfinished save (a ``.tmp-`` directory, never a complete checkpoint); whether it is gone."""
    if not TMP_DIR.match(tmp.name):
        raise ValueError(f"{tmp} is not an unfinished save")
    shutil.rmtree(tmp, ignore_errors=True)  # another rank may be removing it too
    return not tmp.exists()


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# A checkpoint that cannot be loaded is moved aside under this suffix (never
# deleted: it is evidence, and it may be repairable); resume, keepLast and
# later saves of the same step then no longer see it.
UNLOADABLE_SUFFIX = ".unloadable"


def set_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.unloadable`` (``-2``, ``-3``... if taken); returns the new path."""
    target = path.with_name(path.name + UNLOADABLE_SUFFIX)
    n = 2
    while target.exists():
        target = path.with_name(f"{path.name}{UNLOADABLE_SUFFIX}-{n}")
        n += 1
    path.rename(target)
    fsync_dir(path.parent)
    return target


def commit(tmp: Path, final: Path, marker: dict[str, Any]) -> None:
    """Mark the finished save ``tmp`` complete and rename it to ``final``, replacing what is there."""
    with open(tmp / MARKER, "w") as f:
        json.dump(marker, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    if final.exists():
        # A fresh run (resume: never) re-saving a step of an older run.
        shutil.rmtree(final)
    tmp.rename(final)
    fsync_dir(final.parent)
