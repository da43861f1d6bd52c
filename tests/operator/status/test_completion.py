"""Progress and time left for the status and kubectl get (controller/status/completion.py)."""

from __future__ import annotations

import pytest
from fsdp_operator.controller.status.completion import MAX_REMAINING_SECONDS, completion_fields


@pytest.mark.parametrize(
    ("seconds", "printed"),
    [
        (59, "59s"),
        (60, "1m00s"),
        (125, "2m05s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (11_100, "3h05m"),
        (86_400 * 2 + 3600 * 4 + 59, "52h00m"),
    ],
)
def test_the_time_left_reads_like_the_trainers_eta(seconds: int, printed: str) -> None:
    # One format for both: the trainer's log line and the status's `remaining`.
    assert completion_fields(0, 1, float(seconds))["remaining"] == printed


def test_progress_is_rounded_down_and_the_time_left_is_steps_left_times_the_step_time() -> None:
    assert completion_fields(step=333, max_steps=1000, seconds_per_step=2.5) == {
        "progressPercentage": 33,
        "estimatedRemainingSeconds": 1668,  # 667 steps x 2.5 s, rounded
        "remaining": "27m48s",
    }


def test_only_the_last_step_is_a_hundred_percent() -> None:
    assert completion_fields(999, 1000, 1.0)["progressPercentage"] == 99
    assert completion_fields(1000, 1000, 1.0) == {
        "progressPercentage": 100,
        "estimatedRemainingSeconds": 0,
        "remaining": "0s",
    }


@pytest.mark.parametrize("rate", [None, 0.0, -1.0, float("nan"), float("inf")])
def test_without_a_usable_step_time_only_the_progress_is_known(rate: float | None) -> None:
    assert completion_fields(50, 200, rate) == {"progressPercentage": 25}


@pytest.mark.parametrize(("step", "max_steps"), [(None, 100), (5, None), (5, 0)])
def test_without_a_step_or_a_step_count_nothing_is_known(step: int | None, max_steps: int | None) -> None:
    assert completion_fields(step, max_steps, 1.0) == {}


def test_a_step_past_max_steps_is_complete_not_more() -> None:
    # A resumed run whose maxSteps was lowered below the checkpoint's step.
    assert completion_fields(150, 100, 1.0) == {
        "progressPercentage": 100,
        "estimatedRemainingSeconds": 0,
        "remaining": "0s",
    }


def test_the_time_left_fits_the_schemas_int32() -> None:
    assert completion_fields(1, 100_000_000, 1e6)["estimatedRemainingSeconds"] == MAX_REMAINING_SECONDS
