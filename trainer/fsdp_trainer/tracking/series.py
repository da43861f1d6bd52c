"""A tracker's name for a series: the Prometheus metric's, so the two never disagree."""

from __future__ import annotations

from fsdp_api.contract import Metric


def series_tag(metric: Metric) -> str:
    """``fsdp_train_loss`` → ``train/loss``: trackers group series by the part before the slash."""
    return metric.name.removeprefix("fsdp_").replace("_", "/", 1)
