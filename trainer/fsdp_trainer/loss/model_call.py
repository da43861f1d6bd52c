"""The one call of the model on one micro-batch: built by the step's strategy, made by the objective.

The losses take this call, never the model: when to run it (after a preference
objective's reference, inside the chunked head's targets) is the loss's
decision, how the model runs (the inputs, the layout around it) is the
strategy's. So the training model is called at one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class ModelCall:
    """``model(**inputs)`` for one micro-batch; ``inputs`` are the model's keyword arguments."""

    model: nn.Module
    inputs: dict[str, Any]

    def __call__(self) -> Any:
        return self.model(**self.inputs)
