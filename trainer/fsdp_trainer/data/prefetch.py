"""The next training batches, produced on a background thread."""

from __future__ import annotations

from typing import Any

from .loader import TrainData
from .packing import Batch


class PrefetchedData:
    """Produces the next batches on a background thread while the step runs.

    On a GPU the step's host sync (the loss for the metrics) leaves the device
    idle while the next batch is tokenized; producing it ahead hides that.
    Each batch travels with the data position *after* it, and
    ``state_dict()`` returns the position after the last batch handed out, so
    checkpoints stay exact whatever the thread has read ahead. The thread is
    the only user of the tokenizer once started (fast tokenizers must not be
    shared between threads), so anything else that tokenizes (validation)
    runs before the first ``next_batch``.
    """

    def __init__(self, inner: TrainData, depth: int = 2) -> None:
        import queue
        import threading

        self.inner = inner
        self._queue: queue.Queue[tuple[Batch, dict[str, Any]] | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._threading = threading
        self._state: dict[str, Any] | None = None

    def _produce(self) -> None:
        import queue

        try:
            while not self._stop.is_set():
                item: tuple[Batch, dict[str, Any]] | BaseException = (
                    self.inner.next_batch(),
                    self.inner.state_dict(),
                )
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._queue.put(e)

    def next_batch(self) -> Batch:
        if self._thread is None:
            self._thread = self._threading.Thread(target=self._produce, name="data-prefetch", daemon=True)
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        batch, self._state = item
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self._state if self._state is not None else self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError("load the data position before the first batch")
        self.inner.load_state_dict(state)
        self._state = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
