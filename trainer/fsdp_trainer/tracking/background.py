"""The trackers' writer thread: points queue up, a bounded queue, and none is ever waited for.

A tracker on a slow volume or a tracking server that is down must not change
the step time. ``log`` puts a point in a bounded queue and returns; when the
queue is full, or a tracker fails to write, the point is dropped, counted, and
said once.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fsdp_api.contract import TRACKER_POINTS_DROPPED, Metric

from .series import series_tag

# How long close() waits for the writer to finish what is queued.
CLOSE_SECONDS = 30.0
# How long a checkpoint waits for the points before it to be written out.
SYNC_SECONDS = 5.0

Point = tuple[int, dict[str, float]]
# (prompt, completion) pairs of training.samples: text, for the trackers that show text.
SampleRows = Sequence[tuple[str, str]]
TextPoint = tuple[int, SampleRows]


class PointsLost(Exception):
    """A tracker that sends points in batches lost ``points`` of them at once (a failed request)."""

    def __init__(self, points: int, cause: str) -> None:
        super().__init__(cause)
        self.points = points


class Tracker(Protocol):
    """One tracker. One that logs to a run somewhere may also have ``url``: set once the run is open."""

    name: str

    def write(self, step: int, values: Mapping[str, float]) -> None: ...

    def write_samples(self, step: int, rows: SampleRows) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Tracking:
    """Rank 0's trackers behind one queue and one thread."""

    def __init__(
        self,
        trackers: Sequence[Tracker],
        capacity: int,
        *,
        on_drop: Callable[[int], None] = lambda n: None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.trackers = list(trackers)
        self.capacity = capacity
        self.dropped = 0
        self._on_drop = on_drop
        self._say = say
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._queue: queue.Queue[Point | TextPoint | threading.Event | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="trackers", daemon=True)
        self._thread.start()

    def log(self, step: int, values: Mapping[Metric, float | None]) -> None:
        """Queue one step's values (None: not known, left out); never blocks."""
        point = {series_tag(m): float(v) for m, v in values.items() if v is not None}
        if not point:
            return
        try:
            self._queue.put_nowait((step, point))
        except queue.Full:
            self._drop("queue", f"the trackers' writer is {self.capacity} points behind")

    def log_samples(self, step: int, rows: SampleRows) -> None:
        """Queue one step's samples (training.samples); never blocks."""
        try:
            self._queue.put_nowait((step, tuple(rows)))
        except queue.Full:
            self._drop("queue", f"the trackers' writer is {self.capacity} points behind")

    def run_urls(self) -> dict[str, str]:
        """tracker name → the address of its run, for the trackers that have opened one."""
        return {t.name: url for t in self.trackers if (url := getattr(t, "url", None))}

    def sync(self, timeout: float = SYNC_SECONDS) -> bool:
        """Wait, at most ``timeout`` s, until the points logged so far are written out; whether they are.

        Called at each checkpoint: a process killed later (a node lost, an OOM kill)
        then loses only points after the checkpoint, which the resumed training logs
        again, so its curves have no gap. A writer that is far behind (its queue full)
        is not waited for.
        """
        written = threading.Event()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(written)
            if written.wait(timeout):
                return True
        self._say_once(
            "sync", f"tracking: points logged before a checkpoint were not written out within {timeout:g} s; going on"
        )
        return False

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Write what is queued (for at most ``timeout`` s), then close the trackers."""
        deadline = time.monotonic() + timeout
        stop_queued = False
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
            stop_queued = True
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            left = self._queue.qsize() - stop_queued
            self._say(f"tracking: {left} points were still queued after {timeout:g} s and are not written")
            return  # the writer thread still uses the trackers: closing them under it could corrupt a file
        for tracker in self.trackers:
            try:
                tracker.close()
            except PointsLost as e:
                self._drop(tracker.name, f"{tracker.name} failed to send its last {e.points} points: {e}", e.points)
            except Exception as e:
                self._say(f"tracking: closing {tracker.name} failed: {type(e).__name__}: {e}")
        if self.dropped:
            self._say(f"tracking: {self.dropped} points were dropped in all ({TRACKER_POINTS_DROPPED.name}_total)")

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                self._flush_all()
                item.set()
                continue
            step, values = item
            for tracker in self.trackers:
                try:
                    if isinstance(values, dict):
                        tracker.write(step, values)
                    else:
                        tracker.write_samples(step, values)
                except PointsLost as e:
                    why = f"{tracker.name} failed to send {e.points} points up to step {step}: {e}"
                    self._drop(tracker.name, why, e.points)
                except Exception as e:
                    self._drop(tracker.name, f"{tracker.name} failed to write step {step}: {type(e).__name__}: {e}")

    def _flush_all(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.flush()
            except PointsLost as e:
                self._drop(tracker.name, f"{tracker.name} failed to send {e.points} points: {e}", e.points)
            except Exception as e:
                self._say_once(
                    f"flush-{tracker.name}", f"tracking: {tracker.name} failed to flush: {type(e).__name__}: {e}"
                )

    def _say_once(self, key: str, text: str) -> None:
        with self._lock:
            first = key not in self._said
            self._said.add(key)
        if first:
            self._say(text)

    def _drop(self, key: str, why: str, points: int = 1) -> None:
        """Count dropped points; say why the first time for each cause."""
        with self._lock:
            self.dropped += points
            first = key not in self._said
            self._said.add(key)
        self._on_drop(points)
        if first:  # not _say_once: the count and the first-time test share the lock
            self._say(
                f"tracking: {why}; dropping such points, the training does not wait "
                f"(counted in {TRACKER_POINTS_DROPPED.name}_total)"
            )
