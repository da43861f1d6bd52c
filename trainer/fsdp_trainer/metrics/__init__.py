"""Observability of the trainer: Prometheus metrics, MFU and rank 0's progress log.

The train loop talks to ``MetricsProcessor`` only; see docs/metrics.md for the
series it exports.
"""

from .processor import MetricsProcessor
from .stats import StepStats

__all__ = ["MetricsProcessor", "StepStats"]
