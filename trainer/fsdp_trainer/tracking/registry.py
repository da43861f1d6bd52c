"""Which trackers exist: one entry per field of spec.tracking, each a module of its own."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from fsdp_api.trainer_config import TrainerConfig

from .background import Tracker, Tracking
from .mlflow import MlflowTracker
from .mlflow import preflight as mlflow_preflight
from .tensorboard import TensorBoardTracker
from .trainjob_status import TrainJobStatusReporter
from .wandb import WandbTracker
from .wandb import preflight as wandb_preflight

# spec.tracking's field name → how to open that tracker from the config.
TRACKERS: dict[str, Callable[[TrainerConfig], Tracker]] = {
    "tensorboard": TensorBoardTracker.from_config,
    "mlflow": MlflowTracker.from_config,
    "wandb": WandbTracker.from_config,
}

# Trackers the cluster turns on through the pod's environment, not the spec: each opens, or
# returns None when its variables are absent.
AMBIENT: dict[str, Callable[[TrainerConfig, Mapping[str, str]], Tracker | None]] = {
    TrainJobStatusReporter.name: TrainJobStatusReporter.from_env,
}


# tracker_problems asks a tracker's check only when the config names that tracker.
def _mlflow_preflight(cfg: TrainerConfig, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    assert cfg.tracking.mlflow is not None
    return mlflow_preflight(cfg.tracking.mlflow, env)


def _wandb_preflight(cfg: TrainerConfig, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    assert cfg.tracking.wandb is not None
    return wandb_preflight(cfg.tracking.wandb, env)


# spec.tracking's field name → the pod's check of that tracker: (errors, warnings).
# A tracker that writes files only (TensorBoard) has nothing to ask before the launch.
PREFLIGHTS: dict[str, Callable[[TrainerConfig, Mapping[str, str]], tuple[list[str], list[str]]]] = {
    "mlflow": _mlflow_preflight,
    "wandb": _wandb_preflight,
}


def tracker_problems(cfg: TrainerConfig, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """What the trackers the config asks for say before torchrun starts: (errors, warnings)."""
    errors: list[str] = []
    warnings: list[str] = []
    for name, ask in PREFLIGHTS.items():
        if getattr(cfg.tracking, name) is not None:
            e, w = ask(cfg, env)
            errors += e
            warnings += w
    return errors, warnings


def open_tracking(
    cfg: TrainerConfig,
    *,
    on_drop: Callable[[int], None],
    say: Callable[[str], None],
    env: Mapping[str, str] | None = None,
) -> Tracking | None:
    """The trackers the config (and the environment) ask for behind one writer thread; None for none."""
    trackers = [open_one(cfg) for name, open_one in TRACKERS.items() if getattr(cfg.tracking, name) is not None]
    environ = os.environ if env is None else env
    trackers += [t for open_one in AMBIENT.values() if (t := open_one(cfg, environ)) is not None]
    if not trackers:
        return None
    return Tracking(trackers, cfg.tracking.queue_points, on_drop=on_drop, say=say)
