"""TensorBoard: event files under the checkpoint directory (spec.tracking.tensorboard).

Written with tensorboardX's event-file writer, which needs only protobuf (not
TensorBoard and its server) in the trainer image, from the trackers' thread
(background.py), so nothing here runs on the training thread. The folder sits
next to the checkpoints and persists with them; and a resumed training is the
same run: each process's file starts with a purge at its first step, so
TensorBoard discards what an earlier process logged from that step on, and each
step shows once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdp_api.contract import TENSORBOARD_SUBDIR
from fsdp_api.trainer_config import TrainerConfig

from .background import SampleRows
from .sample_text import SAMPLES_TAG, markdown_table

CONFIG_TAG = "config"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, folder: Path, flush_seconds: int, config_yaml: str) -> None:
        self.folder = folder
        self.flush_seconds = flush_seconds
        self.config_yaml = config_yaml
        self._events: Any = None  # tensorboardX's EventsWriter, opened at the first point
        self._protos: tuple[Any, Any] = (None, None)  # its Event and Summary messages, imported then
        self._flushed_at = 0.0

    @classmethod
    def from_config(cls, cfg: TrainerConfig) -> TensorBoardTracker:
        spec = cfg.tracking.tensorboard
        assert spec is not None
        return cls(Path(cfg.checkpoint.dir) / TENSORBOARD_SUBDIR, spec.flush_seconds, cfg.to_yaml())

    def write(self, step: int, values: Mapping[str, float]) -> None:
        events = self._events or self._open(step)
        Event, Summary = self._protos
        # One event per step holding every series: TensorBoard reads them so, and one
        # event per series (SummaryWriter.add_scalar) costs about ten times the CPU.
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()])
        events.write_event(Event(wall_time=time.time(), step=step, summary=summary))
        if time.monotonic() - self._flushed_at >= self.flush_seconds:
            self.flush()

    def write_samples(self, step: int, rows: SampleRows) -> None:
        from tensorboardX.summary import text

        events = self._events or self._open(step)
        Event, _ = self._protos
        events.write_event(
            Event(wall_time=time.time(), step=step, summary=text(SAMPLES_TAG, markdown_table(step, rows)))
        )

    def flush(self) -> None:
        if self._events is not None:
            self._events.flush()
            self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def _open(self, first_step: int) -> Any:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import text

        self.folder.mkdir(parents=True, exist_ok=True)
        # The name holds the start time and the host (the pod); the suffix keeps two
        # processes that start in the same second apart, and names sort by start.
        events = EventsWriter(str(self.folder / "events"), f".step{first_step:09d}")
        now = time.time()
        # TensorBoard's reader drops the points an earlier file holds from this step on.
        events.write_event(Event(wall_time=now, step=first_step, session_log=SessionLog(status=SessionLog.START)))
        config = text(CONFIG_TAG, f"```yaml\n{self.config_yaml}```")
        events.write_event(Event(wall_time=now, step=first_step, summary=config))
        self._events, self._flushed_at, self._protos = events, time.monotonic(), (Event, Summary)
        return events
