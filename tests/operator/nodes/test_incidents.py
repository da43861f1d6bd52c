"""Repeated failures and stalls on one node across restarts (controller/nodes/incidents.py) and their verdict.

Against a real API server: tests/operator/controller/test_operator_e2e.py,
``test_a_node_where_the_trainer_keeps_failing…``;
a stall's node on the local cluster: tests/e2e/test_stall.py::test_a_hung_rank_is_flagged_stalled_restarted_and_resumes.
"""

from __future__ import annotations

from typing import Any

from fsdp_operator.controller.nodes.health import node_health
from fsdp_operator.controller.nodes.incidents import (
    REPEATED,
    new_failures,
    repeated,
    with_failures,
    with_stall,
    without,
)

NOW = "2026-11-29T04:00:00Z"


def pod(name: str, node: str, *terminations: tuple[int, str, str], container: str = "pytorch") -> dict[str, Any]:
    """A pod whose trainer container ended ``(exitCode, reason, finishedAt)``: current state first, then last."""
    states = [{"terminated": {"exitCode": c, "reason": r, "finishedAt": t}} for c, r, t in terminations]
    states += [{"running": {}}] * (2 - len(states))
    status = {"name": container, "state": states[0], "lastState": states[1]}
    return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": {"containerStatuses": [status]}}


def test_a_crash_is_counted_once_against_its_node() -> None:
    pods = [pod("j-worker-1", "gpu-1", (137, "Error", "2026-11-29T03:50:00Z")), pod("j-worker-0", "gpu-0")]
    own, shared = new_failures(pods, [])
    assert [(f.node, f.exit_code) for f in own] == [("gpu-1", 137)] and shared == []
    incidents = with_failures([], own, shared, NOW)
    assert incidents == [
        {
            "node": "gpu-1",
            "failures": 1,
            "stalls": 0,
            "lastFailureAt": "2026-11-29T03:50:00Z",
            "last": "the trainer container of pod j-worker-1 exited 137 (Error) at 2026-11-29T03:50:00Z",
            "time": NOW,
        }
    ]
    # The next check sees the same lastState: nothing new.
    assert new_failures(pods, incidents) == ([], [])
    assert repeated(incidents) == {}  # one failure happens to any node


def test_the_second_failure_on_the_node_makes_it_a_suspect_with_the_counts_as_evidence() -> None:
    once = pod("j-worker-1", "gpu-1", (1, "Error", "2026-11-29T03:50:00Z"))
    first = with_failures([], *new_failures([once], []), NOW)
    again = pod("j-worker-1", "gpu-1", (139, "Error", "2026-11-29T03:55:00Z"), (1, "Error", "2026-11-29T03:50:00Z"))
    own, shared = new_failures([again], first)
    assert [f.exit_code for f in own] == [139]
    incidents = with_failures(first, own, shared, NOW)
    assert incidents[0]["failures"] == REPEATED
    evidence = repeated(incidents)
    assert evidence == {
        "gpu-1": [
            "2 trainer failure(s) across restarts (the last: the trainer container of pod j-worker-1 exited 139 "
            "(Error) at 2026-11-29T03:55:00Z)"
        ]
    }
    health = node_health([again, pod("j-worker-0", "gpu-0")], None, None, None, evidence)
    assert health is not None and [s.node for s in health.suspects] == ["gpu-1"]
    assert health.message().startswith("node gpu-1 (pods j-worker-1): 2 trainer failure(s) across restarts")


def test_what_is_not_the_nodes_fault_is_not_counted() -> None:
    clean = pod("a", "gpu-0", (0, "Completed", "2026-11-29T03:50:00Z"))
    stopped = pod("b", "gpu-1", (143, "Error", "2026-11-29T03:50:00Z"))
    refused = pod("c", "gpu-2", (2, "Error", "2026-11-29T03:50:00Z"))  # the config check: the spec's fault
    oom = pod("d", "gpu-3", (137, "OOMKilled", "2026-11-29T03:50:00Z"))  # the memory plan's
    sidecar = pod("e", "gpu-4", (1, "Error", "2026-11-29T03:50:00Z"), container="log-shipper")
    unplaced = pod("f", "", (1, "Error", "2026-11-29T03:50:00Z"))
    assert new_failures([clean, stopped, refused, oom, sidecar, unplaced], []) == ([], [])


def test_failures_on_two_nodes_together_are_the_jobs_and_only_marked_seen() -> None:
    pods = [
        pod("j-worker-0", "gpu-0", (1, "Error", "2026-11-29T03:50:00Z")),
        pod("j-worker-1", "gpu-1", (1, "Error", "2026-11-29T03:51:30Z")),
    ]
    own, shared = new_failures(pods, [])
    assert own == [] and [f.node for f in shared] == ["gpu-0", "gpu-1"]
    incidents = with_failures([], own, shared, NOW)
    assert [(i["node"], i["failures"], i["lastFailureAt"]) for i in incidents] == [
        ("gpu-0", 0, "2026-11-29T03:50:00Z"),
        ("gpu-1", 0, "2026-11-29T03:51:30Z"),
    ]
    assert incidents[0]["last"].endswith("with pods on other nodes (not counted: the job's failure)")
    assert new_failures(pods, incidents) == ([], [])  # seen: not judged again
    # A later failure of one node alone counts, even beside the other's old one.
    later = pod("j-worker-1", "gpu-1", (1, "Error", "2026-11-29T04:10:00Z"), (1, "Error", "2026-11-29T03:51:30Z"))
    own, _ = new_failures([pods[0], later], incidents)
    assert [(f.node, f.finished_at) for f in own] == [("gpu-1", "2026-11-29T04:10:00Z")]


def test_a_failure_soon_after_one_counted_on_another_node_is_shared_too() -> None:
    counted = with_failures([], *new_failures([pod("a", "gpu-0", (1, "Error", "2026-11-29T03:50:00Z"))], []), NOW)
    own, shared = new_failures([pod("b", "gpu-1", (1, "Error", "2026-11-29T03:50:40Z"))], counted)
    assert own == [] and [f.node for f in shared] == ["gpu-1"]


def test_stalls_and_failures_add_up_on_a_node_and_an_excluded_node_starts_over() -> None:
    incidents = with_stall([], "gpu-1", "the stall after step 18: node rank 1 is not waiting", NOW)
    assert repeated(incidents) == {}
    failure = pod("j-worker-1", "gpu-1", (1, "Error", "2026-11-29T03:50:00Z"))
    incidents = with_failures(incidents, *new_failures([failure], incidents), NOW)
    assert (incidents[0]["failures"], incidents[0]["stalls"]) == (1, 1)
    assert repeated(incidents)["gpu-1"][0].startswith(
        "1 trainer failure(s) and 1 stall(s) with its rank the one behind across restarts (the last: the trainer"
    )
    assert without(incidents, ["gpu-1"]) == []


def test_a_node_without_the_trainings_pods_is_not_judged_on_its_history() -> None:
    incidents = with_stall(with_stall([], "gpu-1", "x", NOW), "gpu-1", "y", NOW)
    health = node_health([pod("j-worker-0", "gpu-0")], {}, None, None, repeated(incidents))
    assert health is not None and health.healthy
