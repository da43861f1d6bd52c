"""The checkpoint directory's step folders, read without torch: the trainer writes them, run-local reads them.

``step-00000500/`` with its ``COMPLETE`` marker is a complete checkpoint
(the trainer's ``checkpoint/layout.py`` describes the whole layout); anything
else in the directory (a save in progress, one set aside) is not counted.
"""

from __future__ import annotations

import re
from pathlib import Path

from .contract import CHECKPOINT_COMPLETE_MARKER, CHECKPOINT_DIR_PREFIX

STEP_DIR = re.compile(rf"^{re.escape(CHECKPOINT_DIR_PREFIX)}(\d{{8}})$")


def step_dir_name(step: int) -> str:
    return f"{CHECKPOINT_DIR_PREFIX}{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = STEP_DIR.match(entry.name)
        if m and entry.is_dir() and (entry / CHECKPOINT_COMPLETE_MARKER).is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)
