"""What the train loop hands the metrics processor after every optimizer step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..loss.preference import PreferenceStats
    from .router_probe import RouterStats


@dataclass
class StepStats:
    """One optimizer step, as measured by the train loop.

    ``loss`` is already averaged over all ranks and ``tokens`` counts the whole
    job (every rank, every micro-batch of the step), so every rank reports the
    same job-level numbers; ``data_seconds``, ``wait_seconds`` and
    ``lateness_seconds`` are this rank's own.
    """

    step: int
    loss: float
    learning_rate: float
    grad_norm: float
    tokens: int
    step_seconds: float
    data_seconds: float
    # This rank's wait at the step's start for the last rank, and how much later than the
    # first rank it arrived there itself (the straggler signal, docs/operator.md).
    wait_seconds: float = 0.0
    lateness_seconds: float = 0.0
    # Tokens whose prediction is in the loss (job-level); None: all of ``tokens``
    # (data.format text). Prompts and padding of the supervised formats are not.
    trained_tokens: int | None = None
    # training.objective dpo and simpo: the step's rewards and preference accuracy.
    preference: PreferenceStats | None = None
    # A mixture-of-experts model: each MoE layer's expert load over every rank's tokens (router_probe.py).
    router: RouterStats | None = None

    @property
    def trained(self) -> int:
        return self.tokens if self.trained_tokens is None else self.trained_tokens
