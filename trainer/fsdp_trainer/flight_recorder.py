"""What this process's collectives were doing when it hung: torch's flight recorder, for the stall dump.

With ``TORCH_FR_BUFFER_SIZE`` > 0, torch.distributed keeps the last collectives
of every process group in a ring buffer, gloo and NCCL alike (torch 2.15;
``TORCH_NCCL_TRACE_BUFFER_SIZE`` is its deprecated name). ``arm`` turns it on
before the process group exists, unless the pod's env says otherwise, and on
NCCL also lets NCCL's own watchdog dump it on a collective timeout, per rank,
into the stalls folder (``TORCH_NCCL_DUMP_ON_TIMEOUT``,
``TORCH_FR_DUMP_TEMP_FILE``; torchtitan sets the same three,
``torchtitan/distributed/utils.py``). When the trainer's step watchdog fires,
``summary`` names the collectives that never completed (the one this rank
waits in) and the last one that did, and ``entries`` go to a JSON file next
to the stacks (watchdog.py).
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
NCCL_DUMP_ON_TIMEOUT_ENV = "TORCH_NCCL_DUMP_ON_TIMEOUT"
DUMP_FILE_ENV = "TORCH_FR_DUMP_TEMP_FILE"
# About the last few steps of a large model (FSDP issues a few collectives per layer and step).
BUFFER_ENTRIES = 2000
# In-flight and completed collectives named in the summary.
SHOWN = 3


def arm(stalls_dir: Path | None, nccl: bool) -> None:
    """Turn the recorder on for the process groups about to be created; a value in the env wins."""
    os.environ.setdefault(BUFFER_ENV, str(BUFFER_ENTRIES))
    if nccl and stalls_dir is not None:
        os.environ.setdefault(NCCL_DUMP_ON_TIMEOUT_ENV, "1")
        os.environ.setdefault(DUMP_FILE_ENV, str(stalls_dir / "nccl-trace-rank-"))


def entries() -> list[dict[str, Any]] | None:
    """The recorded collectives, oldest first; None when the recorder is off or torch cannot say."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace

        # torch's own pickle of its own ring buffer, made in this process.
        trace = pickle.loads(_dump_fr_trace())
    except Exception:  # the recorder is torch-internal: any failure means "nothing to add"
        return None
    return list(trace.get("entries") or [])


def _describe(e: Mapping[str, Any], now_ns: int) -> str:
    group = e.get("process_group") or ("?", "?")
    name = group[1] if isinstance(group, list | tuple) and len(group) > 1 else group
    age = (now_ns - int(e.get("time_created_ns") or now_ns)) / 1e9
    sizes = e.get("input_sizes") or []
    return (
        f"{e.get('profiling_name', '?')} (process group {name}, collective #{e.get('collective_seq_id', '?')}, "
        f"input sizes {sizes}, issued {age:.1f} s ago)"
    )


def summary(recorded: Sequence[Mapping[str, Any]] | None, now_ns: int | None = None) -> str:
    """Lines for the stall dump: the collectives not completed (newest last) and the last completed one."""
    if recorded is None:
        return f"collectives: the flight recorder is off ({BUFFER_ENV} unset or 0) or unavailable"
    now = now_ns if now_ns is not None else time.time_ns()
    pending = [e for e in recorded if not e.get("retired")]
    done = [e for e in recorded if e.get("retired")]
    lines = [f"collectives ({len(recorded)} recorded):"]
    if pending:
        lines += [f"  not completed: {_describe(e, now)}" for e in pending[-SHOWN:]]
    else:
        lines.append("  not completed: none (this rank is not waiting in a collective)")
    if done:
        lines.append(f"  last completed: {_describe(done[-1], now)}")
    return "\n".join(lines)
