"""Whose checkpoints are in ``checkpoint.dir``: one run's, or this one may not start there.

Checkpoints are named by step only, so two runs in one directory mix: the
newest step of either is resumed and exported, and pruning by step number
deletes the other's. Each checkpoint keeps the config it was trained with
(``CONFIG_FILE``), which names its training (``job``).
"""

from __future__ import annotations

from pathlib import Path

from fsdp_api.trainer_config import JobInfo

from .layout import CONFIG_FILE, complete_checkpoints
from .saved_config import parse_saved_job


def saved_job(path: Path) -> JobInfo | None:
    """The training a checkpoint belongs to (None: its config is absent or unreadable)."""
    try:
        text = (path / CONFIG_FILE).read_text()
    except OSError:  # an older checkpoint without the file: no claim either way
        return None
    return parse_saved_job(text)  # the job alone: a newer trainer's extra fields do not hide the owner


def directory_conflicts(root: Path, resume: str, job: JobInfo) -> list[str]:
    """Why this run may not use ``root`` (config error lines), or nothing."""
    complete = complete_checkpoints(root)
    if not complete:
        return []
    step, newest = complete[-1]
    held = f"checkpoint.dir: {root} already holds {len(complete)} checkpoint(s), the newest of step {step}"
    if resume == "never":
        return [
            f"{held}; checkpoint.resume: never would mix this run's checkpoints with them (pruning by step "
            "number deletes the newer run's, export takes the highest step): empty the directory, choose "
            "another checkpoint.dir, or resume from them with checkpoint.resume: auto"
        ]
    owner = saved_job(newest)
    if owner is not None and (owner.namespace, owner.name) != (job.namespace, job.name):
        return [
            f"{held}, of training {owner.namespace}/{owner.name}; this is {job.namespace}/{job.name}. Two trainings "
            "in one directory resume from and prune each other's checkpoints: give each its own checkpoint.dir"
        ]
    return []
