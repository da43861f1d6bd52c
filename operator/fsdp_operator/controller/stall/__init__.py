"""The stall watchdog: when a running training is stalled (``rules``), and what the pod loop does then (``check``).

Only the pure rules are exported here: ``check`` writes the status through
``controller/records.py``, which itself needs the rules' types, so it is
imported as ``controller.stall.check`` by the pod loop.
"""

from __future__ import annotations

from .rules import (
    EMA_WEIGHT,
    StallRules,
    StallVerdict,
    StepClock,
    allowance,
    observe,
    observe_unreachable,
    start_clock,
    verdict,
)

__all__ = [
    "EMA_WEIGHT",
    "StallRules",
    "StallVerdict",
    "StepClock",
    "allowance",
    "observe",
    "observe_unreachable",
    "start_clock",
    "verdict",
]
