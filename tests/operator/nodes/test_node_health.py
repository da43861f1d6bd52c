"""NodesHealthy: what the nodes under a training's pods say of themselves (the EKS node monitoring agent's conditions).

Against the real API server: tests/operator/controller/test_operator_e2e.py::
test_a_node_whose_own_conditions_report_a_problem_is_named_in_the_status.
"""

from __future__ import annotations

from typing import Any

from fsdp_operator.controller.nodes.health import SUSPECT_CONDITIONS, node_health
from fsdp_operator.controller.status.compute import (
    NODES_HEALTHY,
    Observations,
    compute_status,
    status_document,
    transition_events,
)

from tests.operator.status_fixtures import NOW, conditions_of, facts, job

RUNNING = {"type": "Running", "status": "True", "reason": "Running", "message": "job is running"}


def pod(name: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node} if node else {}}


def node(name: str, *conditions: tuple[str, str, str, str]) -> dict[str, Any]:
    conds = [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": "True"}, *conds]}}


XID = ("AcceleratedHardwareReady", "False", "NvidiaXID79Error", "GPU has fallen off the bus")
NET = ("NetworkingReady", "False", "IPAMDNotReady", "")


def test_only_the_agents_conditions_when_false_make_a_node_suspect_and_each_is_named() -> None:
    assert SUSPECT_CONDITIONS == (
        "AcceleratedHardwareReady",
        "NetworkingReady",
        "KernelReady",
        "StorageReady",
        "ContainerRuntimeReady",
    )
    nodes = {
        "n1": node("n1", XID, NET),
        "n2": node("n2", ("AcceleratedHardwareReady", "True", "AcceleratedHardwareIsReady", "")),
        # Ready=False is the node lifecycle's business (it evicts); MemoryPressure is kubelet's, not a fault.
        "n3": {"metadata": {"name": "n3"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
    }
    pods = [pod("w-0", "n1"), pod("w-1", "n2"), pod("w-2", "n3"), pod("w-3", "n1"), pod("w-4", None)]
    health = node_health(pods, nodes)
    assert health is not None and not health.healthy and health.nodes == 3
    assert health.message() == (
        "node n1 (pods w-0, w-3): AcceleratedHardwareReady=False (NvidiaXID79Error: GPU has fallen off the bus); "
        "NetworkingReady=False (IPAMDNotReady)"
    )
    assert node_health([pod("w-4", None)], nodes) is None  # no pod on a node yet: nothing to say
    healthy = node_health([pod("w-1", "n2")], nodes)
    assert healthy is not None and healthy.healthy
    assert healthy.message() == "no node condition reports a problem on the 1 node(s) of the training's pods"


def test_a_message_names_three_nodes_and_counts_the_rest() -> None:
    nodes = {f"n{i}": node(f"n{i}", XID) for i in range(5)}
    health = node_health([pod(f"w-{i}", f"n{i}") for i in range(5)], nodes)
    assert health is not None and health.message().endswith("; and 2 more node(s)")
    assert health.message().count("AcceleratedHardwareReady=False") == 3


def test_the_condition_speaks_for_a_running_training_posts_an_event_and_is_kept_between_looks() -> None:
    health = node_health([pod("llama-worker-0", "n1")], {"n1": node("n1", XID)})
    status = compute_status(facts(), job(RUNNING), None, Observations(nodes=health, now=NOW))
    cond = conditions_of(status)[NODES_HEALTHY]
    assert (cond.status, cond.reason) == ("False", "SuspectNode")
    assert status.message == cond.message == health.message()  # the status' message while Running
    [event] = [e for e in transition_events(None, status) if e.reason == "SuspectNode"]
    assert (event.type, event.message) == ("Warning", health.message())

    stored = status_document(status)
    kept = compute_status(facts(), job(RUNNING), stored, Observations(now=NOW))  # another writer: no look at the nodes
    assert conditions_of(kept)[NODES_HEALTHY].message == health.message()
    assert not [e for e in transition_events(stored, kept) if e.reason == "SuspectNode"]  # said once

    repaired = node_health([pod("llama-worker-0", "n1")], {"n1": node("n1")})
    fixed = compute_status(facts(), job(RUNNING), stored, Observations(nodes=repaired, now=NOW))
    assert (conditions_of(fixed)[NODES_HEALTHY].status, fixed.message) == ("True", "job is running")

    done = compute_status(
        facts(), job({"type": "Succeeded", "status": "True", "reason": "Done"}), stored, Observations(now=NOW)
    )
    assert NODES_HEALTHY not in conditions_of(done)  # no pods, nothing to say of their nodes
