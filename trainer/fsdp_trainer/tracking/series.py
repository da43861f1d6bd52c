"""What every tracker names the same way: a series (after its Prometheus metric) and the training."""

from __future__ import annotations

import os

from fsdp_api.contract import ENV_TRAINING_IMAGE, ENV_TRAINING_UID, Metric
from fsdp_api.trainer_config import TrainerConfig


def series_tag(metric: Metric) -> str:
    """``fsdp_train_loss`` → ``train/loss``: trackers group series by the part before the slash."""
    return metric.name.removeprefix("fsdp_").replace("_", "/", 1)


def training_identity(cfg: TrainerConfig) -> dict[str, str]:
    """What names the training in a tracker's run (MLflow tags, W&B config); unknown entries left out.

    The uid and image come only from the operator's render (contract.ENV_TRAINING_UID says why).
    """
    job, model = cfg.job, cfg.model
    identity = {
        "training": job.name,
        "namespace": job.namespace,
        "model": model.pretrained or model.architecture or model.preset or "",
        "image": os.environ.get(ENV_TRAINING_IMAGE, ""),
        "uid": os.environ.get(ENV_TRAINING_UID, ""),
    }
    return {k: v for k, v in identity.items() if v}
