"""Fault injection for the resume and atomic-checkpoint tests.

``FSDP_TRAINER_FAULT=<point>:<step>[:<rank>]`` SIGKILLs the process (rank 0
unless given) when it reaches ``point`` at ``step``, as a node loss or OOM kill
would: no cleanup, no exception handlers. Points: ``after_step`` (the step's
update is done, nothing saved yet) and ``during_save`` (the checkpoint's shards
are written but it is not yet marked complete). Only the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0) is killed, so a torchrun restart resumes.
"""

from __future__ import annotations

import os
import signal

from fsdp_api.contract import ENV_TRAINER_FAULT


def maybe_fault(point: str, step: int, rank: int) -> None:
    spec = os.environ.get(ENV_TRAINER_FAULT)
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    parts = spec.split(":")
    target_rank = int(parts[2]) if len(parts) > 2 else 0
    if parts[0] == point and int(parts[1]) == step and rank == target_rank:
        os.kill(os.getpid(), signal.SIGKILL)
