"""Fault injection for the resume, atomic-checkpoint and stall tests (never set in production).

``FSDP_TRAINER_FAULT=<point>:<step>[:<rank>[:<action>]]`` acts when rank
``rank`` (0 unless given) reaches ``point`` at ``step``. Points:
``after_step`` (the step's update is done, nothing saved yet) and
``during_save`` (the checkpoint's shards are written but it is not yet
marked complete). Actions:

- ``kill`` (the default): SIGKILL, as a node loss or OOM kill would: no
  cleanup, no exception handlers;
- ``hang``: never return (a deadlocked collective or a dead filesystem);
- ``sleep<seconds>``, e.g. ``sleep20``: a slow but live rank (a slow save).

A fault fires once: only in the first torchrun attempt
(``TORCHELASTIC_RESTART_COUNT`` 0), and, when the caller names a directory
that outlives the process (the checkpoint directory), only if no earlier
process left its marker there, so re-created pods resume instead of failing
again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from fsdp_api.contract import ENV_TRAINER_FAULT

MARKER_DIR = ".faults-fired"


def _act(action: str) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        while True:
            time.sleep(3600)
    elif action.startswith("sleep"):
        time.sleep(float(action.removeprefix("sleep")))
    else:
        raise ValueError(f"{ENV_TRAINER_FAULT}: unknown action {action!r} (kill, hang or sleep<seconds>)")


def maybe_fault(point: str, step: int, rank: int, once_dir: str | Path | None = None) -> None:
    spec = os.environ.get(ENV_TRAINER_FAULT)
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    parts = spec.split(":")
    target_rank = int(parts[2]) if len(parts) > 2 else 0
    if parts[0] != point or int(parts[1]) != step or rank != target_rank:
        return
    if once_dir is not None:
        marker = Path(once_dir) / MARKER_DIR / spec.replace(":", "_")
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    _act(parts[3] if len(parts) > 3 else "kill")
