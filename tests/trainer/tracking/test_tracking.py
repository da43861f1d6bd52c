"""The trackers' writer (fsdp_trainer/tracking): never waits, counts what it drops; TensorBoard resumes one run."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from fsdp_api import contract
from fsdp_api.spec import TrackingSpec
from fsdp_trainer.tracking import TRACKERS, Tracking, series_tag
from fsdp_trainer.tracking.tensorboard import CONFIG_TAG, TensorBoardTracker

from tests.trainer.tracking.board import read_scalars


class Recorder:
    name = "recorder"

    def __init__(self, gate: threading.Event | None = None, fail_on: set[int] | None = None) -> None:
        self.points: list[tuple[int, dict[str, float]]] = []
        self.gate = gate
        self.fail_on = fail_on or set()
        self.closed = False
        self.entered = threading.Event()
        self.flushed_after: list[int] = []

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if step in self.fail_on:
            raise OSError(28, "No space left on device")
        self.points.append((step, dict(values)))

    def flush(self) -> None:
        self.flushed_after.append(len(self.points))

    def close(self) -> None:
        self.closed = True


def test_every_spec_tracking_field_is_a_registered_tracker() -> None:
    assert set(TRACKERS) == set(TrackingSpec.model_fields) - {"queue_points"}


def test_series_are_named_after_the_prometheus_metrics() -> None:
    assert series_tag(contract.LOSS) == "train/loss"
    assert series_tag(contract.EVAL_LOSS) == "train/eval_loss"
    assert series_tag(contract.CHECKPOINT_SAVE_DURATION) == "checkpoint/save_duration_seconds"


def test_points_reach_the_tracker_in_order_and_unknown_values_are_left_out() -> None:
    recorder, said = Recorder(), []
    tracking = Tracking([recorder], 100, say=said.append)
    for step in range(1, 4):
        tracking.log(step, {contract.LOSS: 1.0 / step, contract.MFU: None})
    tracking.log(4, {contract.MFU: None})  # nothing known: no point at all
    tracking.close()
    assert recorder.points == [(s, {"train/loss": 1.0 / s}) for s in range(1, 4)]
    assert recorder.closed and said == []


def test_a_stuck_tracker_never_slows_logging_and_the_dropped_points_are_counted_and_said_once() -> None:
    gate, counted, said = threading.Event(), [], []
    recorder = Recorder(gate)
    tracking = Tracking([recorder], 100, on_drop=counted.append, say=said.append)
    tracking.log(1, {contract.LOSS: 2.0})
    assert recorder.entered.wait(10)
    # 999 calls while the writer does not return: they finish, so none waited for it.
    logging = threading.Thread(target=lambda: [tracking.log(s, {contract.LOSS: 2.0}) for s in range(2, 1001)])
    logging.start()
    logging.join(30)
    assert not logging.is_alive(), "log() waited for a stuck tracker"
    # One point is in the writer's hands, 100 wait in the queue, the rest are dropped.
    assert tracking.dropped == sum(counted) == 1000 - 100 - 1
    assert len(said) == 1 and "100 points behind" in said[0] and "fsdp_tracker_points_dropped_total" in said[0]
    gate.set()
    tracking.close()
    assert [s for s, _ in recorder.points] == list(range(1, 102))
    assert said[-1] == "tracking: 899 points were dropped in all (fsdp_tracker_points_dropped_total)"


def test_sync_returns_once_every_point_before_it_is_written_and_flushed() -> None:
    recorder, said = Recorder(), []
    tracking = Tracking([recorder], 100, say=said.append)
    for step in range(1, 51):
        tracking.log(step, {contract.LOSS: 2.0})
    assert tracking.sync(timeout=10)
    assert len(recorder.points) == 50 and recorder.flushed_after == [50]
    tracking.close()
    assert said == []


def test_sync_waits_at_most_its_timeout_for_a_stuck_tracker_and_says_so_once() -> None:
    said: list[str] = []
    gate = threading.Event()
    recorder = Recorder(gate)
    tracking = Tracking([recorder], 100, say=said.append)
    tracking.log(1, {contract.LOSS: 2.0})
    assert not tracking.sync(timeout=0.2)
    assert not tracking.sync(timeout=0.2)
    assert said == ["tracking: points logged before a checkpoint were not written out within 0.2 s; going on"]
    gate.set()
    tracking.close()


def test_close_gives_up_on_a_tracker_that_never_returns_and_says_so() -> None:
    said: list[str] = []
    recorder = Recorder(threading.Event())  # never set
    tracking = Tracking([recorder], 100, say=said.append)
    tracking.log(1, {contract.LOSS: 2.0})
    assert recorder.entered.wait(10)
    for step in range(2, 6):
        tracking.log(step, {contract.LOSS: 2.0})
    started = time.monotonic()
    tracking.close(timeout=0.5)
    # Bounded, not waiting for a tracker that never returns: far above 0.5 s, so a loaded machine passes too.
    assert time.monotonic() - started < 10.0
    assert said == ["tracking: 4 points were still queued after 0.5 s and are not written"]
    assert not recorder.closed  # its writer thread may still be inside it


def test_a_failing_write_drops_that_point_only_and_is_said_once() -> None:
    counted, said = [], []
    recorder = Recorder(fail_on={2, 3})
    tracking = Tracking([recorder], 100, on_drop=counted.append, say=said.append)
    for step in range(1, 5):
        tracking.log(step, {contract.LOSS: 2.0})
    tracking.close()
    assert [s for s, _ in recorder.points] == [1, 4]
    assert sum(counted) == 2
    assert said[0] == (
        "tracking: recorder failed to write step 2: OSError: [Errno 28] No space left on device; dropping such "
        "points, the training does not wait (counted in fsdp_tracker_points_dropped_total)"
    )
    assert len(said) == 2  # that line once, and the total at close


def test_a_resumed_process_continues_the_same_tensorboard_run_with_each_step_once(tmp_path: Path) -> None:
    first = TensorBoardTracker(tmp_path, 1, "job: {name: t}\n")
    for step in range(1, 8):  # checkpoint at 5; steps 6 and 7 are lost with the process
        first.write(step, {"train/loss": 10.0 - step})
    first.close()
    resumed = TensorBoardTracker(tmp_path, 1, "job: {name: t}\n")
    for step in range(6, 11):
        resumed.write(step, {"train/loss": 20.0 - step})
    resumed.close()
    points = read_scalars(tmp_path, "train/loss")
    assert [s for s, _ in points] == list(range(1, 11))
    assert dict(points) == {**{s: 10.0 - s for s in range(1, 6)}, **{s: 20.0 - s for s in range(6, 11)}}
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2


def test_the_run_carries_the_trainer_config(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path, 1, "job: {name: t}\ntraining: {maxSteps: 3}\n")
    tracker.write(1, {"train/loss": 1.0})
    tracker.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    [text] = [t for t in acc.Tags()["tensors"] if t.startswith(CONFIG_TAG)]
    body = acc.Tensors(text)[0].tensor_proto.string_val[0].decode()
    assert "maxSteps: 3" in body


@pytest.mark.parametrize("spec", [{}, {"tensorboard": None}])
def test_no_tracker_asked_for_opens_nothing(spec: dict) -> None:
    from fsdp_api.trainer_config import TrainerConfig
    from fsdp_trainer.tracking import open_tracking

    cfg = TrainerConfig.model_validate({"model": {"preset": "tiny"}, "training": {"maxSteps": 1}, "tracking": spec})
    assert open_tracking(cfg, on_drop=lambda n: None, say=print) is None
