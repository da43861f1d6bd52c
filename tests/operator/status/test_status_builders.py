"""The status' seams: the condition builders' lists and the precedence table of status.message."""

from __future__ import annotations

from fsdp_api.status import Condition
from fsdp_operator.controller.status.compute import MESSAGE_PRECEDENCE, status_message
from fsdp_operator.controller.status.condition_builders import CONDITIONS, EARLY_CONDITIONS

NOW = "2026-01-01T00:00:00Z"


def cond(cond_type: str, status: str, message: str) -> Condition:
    return Condition(type=cond_type, status=status, reason=cond_type, message=message, last_transition_time=NOW)


def test_every_builder_is_listed_once() -> None:
    builders = [*EARLY_CONDITIONS, *CONDITIONS]
    assert len(set(builders)) == len(builders)


def test_the_first_row_that_holds_gives_the_message() -> None:
    conditions = [
        cond("Schedulable", "False", "no node fits"),
        cond("PodsStarted", "False", "image pull failed"),
        cond("ConfigValid", "False", "bad config"),
        cond("Stalled", "True", "no step for 10 min"),
    ]
    assert status_message("Running", "running", conditions) == "no step for 10 min"
    # Stalled speaks only while the job is active; the config's verdict also for a failed job.
    assert status_message("Created", "created", conditions) == "bad config"
    assert status_message("Failed", "backoff limit", conditions) == "bad config"
    assert status_message("Created", "created", conditions[:2]) == "image pull failed"
    assert status_message("Pending", "waiting", conditions[:1]) == "no node fits"


def test_a_condition_in_the_wrong_state_or_phase_leaves_the_phase_message() -> None:
    assert status_message("Running", "running", [cond("Stalled", "False", "progressing")]) == "running"
    assert status_message("Succeeded", "done", [cond("Schedulable", "False", "no node fits")]) == "done"
    assert {row[0] for row in MESSAGE_PRECEDENCE} == {
        "Stalled",
        "NodesHealthy",
        "ConfigValid",
        "PodsStarted",
        "Schedulable",
    }
    # A suspect node speaks for a running training, after a stall; a healthy one never.
    suspect = cond("NodesHealthy", "False", "node n1: AcceleratedHardwareReady=False")
    assert status_message("Running", "running", [suspect]) == "node n1: AcceleratedHardwareReady=False"
    assert status_message("Running", "running", [cond("Stalled", "True", "no step"), suspect]) == "no step"
    assert status_message("Running", "running", [cond("NodesHealthy", "True", "fine")]) == "running"
