"""The stall watchdog's rules: when a running training is stalled (``rules``) and which ranks hold it (``ranks``).

Pure: what the pod loop does about a stall (the Stalled condition, the restart)
is ``controller/stall_check.py``, a floor above the status it writes.
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
