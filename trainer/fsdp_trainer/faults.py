"""Fault injection for the resume, atomic-checkpoint and stall tests (never set in production).

``FSDP_TRAINER_FAULT`` (its grammar: ``fsdp_api.faults``) makes one rank act
at one point of one step. Actions:

- ``kill`` (the default): SIGKILL, as a node loss or OOM kill would: no
  cleanup, no exception handlers;
- ``hang``: never return (a deadlocked collective or a dead filesystem);
- ``sleep<seconds>``, e.g. ``sleep20``: a slow but live rank (a slow save);
- ``slow<seconds>``: the same sleep at that point of every later step too, a
  persistent straggler.

A fault fires once (a ``slow`` one starts once): only in the first torchrun attempt
(``TORCHELASTIC_RESTART_COUNT`` 0), and, when the caller names a directory
that outlives the process (the checkpoint directory), only if no earlier
process left its marker there, so re-created pods resume instead of failing
again.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

from fsdp_api.contract import ENV_TRAINER_FAULT
from fsdp_api.faults import Fault, parse_fault

from .errors import ConfigError

MARKER_DIR = ".faults-fired"
# The slow faults this process started: they go on at every later step.
_started: set[Fault] = set()


def _act(fault: Fault) -> None:
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "hang":
        while True:
            time.sleep(3600)
    else:
        time.sleep(fault.seconds())


def armed_fault() -> Fault | None:
    """The fault this process was told to inject, or None; a malformed value is a ConfigError."""
    value = os.environ.get(ENV_TRAINER_FAULT)
    return _parsed(value) if value else None


@functools.cache  # maybe_fault asks at every step: parse a value once
def _parsed(value: str) -> Fault:
    try:
        return parse_fault(value)
    except ValueError as e:
        raise ConfigError([f"{ENV_TRAINER_FAULT}: {e}"]) from None


def maybe_fault(point: str, step: int, rank: int, once_dir: str | Path | None = None) -> None:
    fault = armed_fault()
    if fault is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    if (fault.point, fault.rank) != (point, rank) or step < fault.step:
        return
    if step > fault.step:
        if fault in _started:
            _act(fault)
        return
    if once_dir is not None:
        marker = Path(once_dir) / MARKER_DIR / os.environ[ENV_TRAINER_FAULT].replace(":", "_")
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    if fault.persistent:
        _started.add(fault)
    _act(fault)
