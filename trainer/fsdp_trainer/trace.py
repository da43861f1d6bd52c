"""A machine-readable record of a run, for tests and debugging (``--trace-dir``).

Each rank appends JSON lines to ``trace-rank<R>.jsonl``: per step the global
loss (full precision), learning rate, gradient norm and the ids of the samples
this rank trained on; evaluations; resume points; and the per-rank parameter
and optimizer-state bytes. Rank 0 also saves the logits of a fixed probe input
at the end (``probe.pt``) so an exported model can be compared with the
trained one. Off by default; it costs one small write per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Trace:
    def __init__(self, directory: Path | None, rank: int) -> None:
        self.directory = directory
        self._file = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._file = open(directory / f"trace-rank{rank}.jsonl", "a")  # noqa: SIM115 - closed in close()

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def write(self, event: str, **fields: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"event": event, **fields}) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
