"""The trainer's own stall watchdog: a step that never ends is dumped, then ended.

A collective waiting for a lost peer, a data loader stuck on a dead
filesystem and a save that never returns look alike from outside: the step
counter stops. The operator notices that from the metrics (and may restart
the pods); inside the process only another thread can still act. Armed
around each step, save and validation with a timeout, the watchdog thread
writes every thread's Python stack, and the collectives torch's flight
recorder saw (flight_recorder.py: the one this rank waits in), to stderr and to
``<checkpoint dir>/stalls/`` (which outlives the pod on a persistent
checkpoint volume) and ends the process with STALL_EXIT_CODE, so that torchrun
or the kubelet restarts it and it resumes from the last checkpoint.

A hang that holds the GIL would keep this thread from running, so
faulthandler's C-level timer is armed a minute later as a fallback: it dumps
the stacks to stderr and exits on its own.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from fsdp_api.contract import STALL_EXIT_CODE

from . import flight_recorder

log = logging.getLogger(__name__)

# faulthandler's fallback fires this long after the thread should have.
FALLBACK_DELAY_SECONDS = 60.0
# Writing the stack file may itself hang (the filesystem is what hangs):
# exit anyway after this long.
FILE_WRITE_SECONDS = 10.0


def all_stacks() -> str:
    """Every thread's Python stack, innermost call last (traceback's order), main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    frames = sorted(sys._current_frames().items(), key=lambda item: item[0] != main)
    parts = []
    for ident, frame in frames:
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def _dump(out: TextIO, header: str, collectives: str) -> None:
    out.write(f"{header}\n{collectives}\n{all_stacks()}\n")
    out.flush()


def _recorded(seconds: float) -> list[dict[str, Any]] | None:
    """The flight recorder's entries, asked from a thread of its own: a hung library must not hold up the exit."""
    found: list[list[dict[str, Any]] | None] = [None]
    reader = threading.Thread(target=lambda: found.__setitem__(0, flight_recorder.entries()), daemon=True)
    reader.start()
    reader.join(seconds)
    return found[0]


class StepWatchdog:
    """Ends the process when an armed phase outlives its timeout; ``timeout`` 0 disables it."""

    def __init__(
        self,
        *,
        rank: int,
        stalls_dir: Path | None,
        enabled: bool = True,
        exit_process: Callable[[int], object] = os._exit,
    ) -> None:
        self.rank = rank
        self.stalls_dir = stalls_dir
        self.enabled = enabled
        self._exit = exit_process
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._seconds = 0.0
        self._closed = False
        self.fired: Path | None = None
        self._thread: threading.Thread | None = None
        if enabled:
            self._thread = threading.Thread(target=self._run, name="step-watchdog", daemon=True)
            self._thread.start()

    def arm(self, what: str, seconds: float) -> None:
        """Start the countdown for one phase (a step, a save), replacing the previous one."""
        if not self.enabled:
            return
        with self._cond:
            self._deadline = time.monotonic() + seconds
            self._what, self._seconds = what, seconds
            self._cond.notify()
        if self._fallback_usable():
            faulthandler.dump_traceback_later(seconds + FALLBACK_DELAY_SECONDS, exit=True, file=sys.stderr)

    def disarm(self) -> None:
        if not self.enabled:
            return
        with self._cond:
            self._deadline = None
            self._cond.notify()
        if self._fallback_usable():
            faulthandler.cancel_dump_traceback_later()

    def close(self) -> None:
        self.disarm()
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @staticmethod
    def _fallback_usable() -> bool:
        try:
            sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            return False  # stderr is not a file (captured): the fallback cannot write
        return True

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                what, seconds = self._what, self._seconds
                self._deadline = None
                break
            else:
                return
        self._fire(what, seconds)

    def _fire(self, what: str, seconds: float) -> None:
        header = (
            f"rank {self.rank}: {what} did not finish within {seconds:g} s "
            f"(spec.stall.trainerStepTimeoutSeconds); stacks of all threads follow; exiting with {STALL_EXIT_CODE}"
        )
        log.error("%s", header.split(";")[0])
        recorded = _recorded(FILE_WRITE_SECONDS)
        collectives = flight_recorder.summary(recorded)
        _dump(sys.stderr, header, collectives)
        if self.stalls_dir is not None:
            writer = threading.Thread(target=self._write_file, args=(header, collectives, recorded), daemon=True)
            writer.start()
            writer.join(FILE_WRITE_SECONDS)
        self._exit(STALL_EXIT_CODE)

    def _write_file(self, header: str, collectives: str, recorded: list[dict[str, Any]] | None) -> None:
        assert self.stalls_dir is not None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = self.stalls_dir / f"rank-{self.rank}-{stamp}.txt"
        try:
            self.stalls_dir.mkdir(parents=True, exist_ok=True)
            if recorded is not None:
                trace = path.with_suffix(".collectives.json")
                trace.write_text(json.dumps(recorded, default=str, indent=1))
            with path.open("w") as f:
                _dump(f, header, collectives)
            self.fired = path
            print(f"rank {self.rank}: stacks written to {path}", file=sys.stderr, flush=True)
        except OSError as e:
            print(f"rank {self.rank}: could not write the stacks to {path}: {e}", file=sys.stderr, flush=True)
