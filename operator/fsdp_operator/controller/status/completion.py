"""How far a running training is and how long it has left: pure arithmetic for the status and kubectl get.

The field names are Kubeflow Trainer v2.3's (``TrainJob.status.trainerStatus``:
progressPercentage, estimatedRemainingSeconds), so a reader of either finds the
same figures under the same names.
"""

from __future__ import annotations

import math
from typing import Any

from fsdp_api.durations import format_duration

# The status schema's bound for estimatedRemainingSeconds (an int32, as in Kubeflow's trainerStatus).
MAX_REMAINING_SECONDS = 2**31 - 1


def completion_fields(step: int | None, max_steps: int | None, seconds_per_step: float | None) -> dict[str, Any]:
    """How far a training is, and how long it has left, as status fields (only those that are known).

    The time left is the steps left times the recent step time; it leaves out
    the checkpoint saves and validations still to come, whose time the stall
    clock keeps out of its step time on purpose.
    """
    if step is None or not max_steps or max_steps < 1:
        return {}
    out: dict[str, Any] = {"progressPercentage": min(100, step * 100 // max_steps)}
    if seconds_per_step is not None and math.isfinite(seconds_per_step) and seconds_per_step > 0:
        seconds = min(MAX_REMAINING_SECONDS, round(max(0, max_steps - step) * seconds_per_step))
        out["estimatedRemainingSeconds"] = seconds
        out["remaining"] = format_duration(seconds)
    return out
