"""Distributed checkpoints (torch.distributed.checkpoint) that are atomic and resumable.

- ``layout.py``: where checkpoints live in ``checkpoint.dir`` (``step-N/``,
  unfinished ``.tmp-`` saves, set-aside ``.unloadable`` ones), listing them,
  the atomic commit (marker, then rename).
- ``state.py``: what a checkpoint holds: model and optimizer (DCP, resharded
  on load), the step, each rank's data position and RNG states.
- ``compatibility.py``: whether a checkpoint fits this run's model (tensor
  names and shapes, LoRA settings), checked from metadata before anything is
  materialised.
- ``unpickle.py``: reading every pickled file of a checkpoint (rank files,
  DCP's ``.metadata`` and non-tensor items) as data: a file that would run
  code is refused.
- ``manager.py``: ``Checkpointer``: when to save, what to keep, which
  checkpoint to resume from; a full volume as one line.
- ``source.py``: ``checkpoint.resumeFrom``: another training's steps to start
  from while this one has none, listed and checked like its own, only read.
- ``remote.py``: the remote tier's uploads (``checkpoint.remote``), each
  rank's files of a committed step in the background; ``remote_store.py``:
  its layout in S3 (the manifest as commit point), listing, download before
  resume, start-up cleaning, the config check's probe.
"""

from __future__ import annotations

from .compatibility import Skipped, architecture_changes, check_candidates, check_resumable, peft_changes
from .layout import (
    CONFIG_FILE,
    MARKER,
    MODEL_CONFIG_DIR,
    RANKS_DIR,
    STEP_DIR,
    TMP_DIR,
    UNLOADABLE_SUFFIX,
    commit,
    complete_checkpoints,
    directory_bytes,
    latest_checkpoint,
    rank_file,
    remove_partial,
    remove_stale,
    set_aside,
    step_dir_name,
)
from .manager import DISK_FULL, Checkpointer, disk_full_error, resume_candidates
from .state import (
    MODEL_KEY,
    ModelState,
    OptimizerState,
    checkpointed_tensors,
    has_frozen,
    load_rank_state,
    rng_state,
    set_rng_state,
)

__all__ = [
    "CONFIG_FILE",
    "DISK_FULL",
    "MARKER",
    "MODEL_CONFIG_DIR",
    "MODEL_KEY",
    "RANKS_DIR",
    "STEP_DIR",
    "TMP_DIR",
    "UNLOADABLE_SUFFIX",
    "Checkpointer",
    "ModelState",
    "OptimizerState",
    "Skipped",
    "architecture_changes",
    "check_candidates",
    "check_resumable",
    "checkpointed_tensors",
    "commit",
    "complete_checkpoints",
    "directory_bytes",
    "disk_full_error",
    "has_frozen",
    "latest_checkpoint",
    "load_rank_state",
    "peft_changes",
    "rank_file",
    "remove_partial",
    "remove_stale",
    "resume_candidates",
    "rng_state",
    "set_aside",
    "set_rng_state",
    "step_dir_name",
]
