"""Which trackers exist: one entry per field of spec.tracking, each a module of its own."""

from __future__ import annotations

from collections.abc import Callable

from fsdp_api.trainer_config import TrainerConfig

from .background import Tracker, Tracking
from .tensorboard import TensorBoardTracker

# spec.tracking's field name → how to open that tracker from the config.
TRACKERS: dict[str, Callable[[TrainerConfig], Tracker]] = {
    "tensorboard": TensorBoardTracker.from_config,
}


def open_tracking(cfg: TrainerConfig, *, on_drop: Callable[[int], None], say: Callable[[str], None]) -> Tracking | None:
    """The trackers the config asks for behind one writer thread; None when it asks for none."""
    trackers = [open_one(cfg) for name, open_one in TRACKERS.items() if getattr(cfg.tracking, name) is not None]
    if not trackers:
        return None
    return Tracking(trackers, cfg.tracking.queue_points, on_drop=on_drop, say=say)
