"""The stall watchdog, end to end: a hung rank is detected and restarted; a slow save is not a stall."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fsdp_api.contract import (
    ENV_TRAINER_FAULT,
    EXCLUDED_BY_ANNOTATION,
    EXCLUDED_NODE_LABEL,
    EXCLUDED_NODE_TAINT,
    EXCLUDED_UNTIL_ANNOTATION,
)
from fsdp_localcluster.binaries import REPO_ROOT
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

from tests.e2e.namespaces import own_namespace
from tests.e2e.timings import record
from tests.e2e.training import (
    RESUMED,
    STOPPED,
    TERMINAL,
    assert_resumed_exactly,
    checkpoint_steps,
    create_claim,
    fsdptraining,
    last_step,
    status,
    step_losses,
    trainer_logs,
    wait_phase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Small allowances so the test runs in a minute; the trainer's own watchdog is
# off, so the operator's is the one that acts.
STALL = {
    "onStall": "restart",
    "minSeconds": 10,
    "stepTimeFactor": 10,
    # Wide: under load a pod start (imports, rendezvous) took over 60 s before the operator saw a
    # first step, and the operator rightly called that "no new step since the start" (issue 23's
    # flake under load). Detection after a step is seen does not depend on it.
    "startupSeconds": 240,
    "checkpointSeconds": 30,
    "maxRestarts": 2,
    "trainerStepTimeoutSeconds": 0,
}


@pytest.fixture
def ns(operator: WholeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_namespace(operator, "stall-", request)


def with_fault(body: dict[str, Any], fault: str) -> dict[str, Any]:
    body["spec"]["stall"] = dict(STALL)
    body["spec"]["env"] = [{"name": ENV_TRAINER_FAULT, "value": fault}]
    return body


def training_events(whole: WholeCluster, name: str, ns: str) -> list[dict[str, Any]]:
    items = json.loads(whole.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    return [
        e for e in items if e["involvedObject"].get("kind") == "FSDPTraining" and e["involvedObject"]["name"] == name
    ]


def reasons(events: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in events]


@pytest.fixture
def gone_after(operator: WholeCluster, ns: str) -> Iterator[None]:
    """The test's pods removed at once afterwards, so that a failure here leaves the GPU nodes to the next test."""
    yield
    operator.kubectl("delete", "fsdptraining", "--all", "-n", ns, "--wait=false", check=False)
    operator.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)


# After the stall restart the re-created pods sometimes never rendezvoused (issue 23): the
# rendezvous host's TCPStore (bound *:29400 in C++) shared the port with another pod's on
# this one machine; node_agent/bind_shim.py gives each pod its own, as its own network would.
@pytest.mark.usefixtures("gone_after")
def test_a_hung_rank_is_flagged_stalled_restarted_and_resumes(operator: WholeCluster, ns: str) -> None:
    whole, name, max_steps, interval, hang_at = operator, "hang", 40, 10, 18
    create_claim(whole, ns)
    # Rank 1 (the second pod) never returns from step 15, as in a deadlocked collective.
    whole.cluster.apply(
        with_fault(fsdptraining(name, ns, max_steps=max_steps, interval=interval), f"after_step:{hang_at}:1:hang")
    )
    wait_for(lambda: last_step(whole, name, ns) >= hang_at, 300, f"step {hang_at}")
    t_hang = time.monotonic()
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in whole.list("pods", ns)}

    def restarted() -> dict[str, Any] | None:
        found = [e for e in training_events(whole, name, ns) if e["reason"] == "StallRestart"]
        return found[0] if found else None

    try:
        event = wait_for(restarted, 120, "a StallRestart Event")
    except AssertionError as e:
        raise AssertionError(
            f"{e}\n{json.dumps(status(whole, name, ns), indent=1)}\n{whole.operator_logs()[-3000:]}"
        ) from e
    detected = time.monotonic() - t_hang
    record("stall_detected_and_restarted_s", detected)
    # The limit is the 10 s floor (steps take well under 1 s) plus a scrape tick or two; well before the
    # 240 s start-up allowance, which would mean the step time was never measured (loaded machines are slower).
    assert detected < 45, detected
    assert f"no new step since step {hang_at}" in event["message"], event["message"]
    # The message names the hung rank (node rank 1: one rank per pod), its pod and node; the other waits for it.
    hung = event["message"].split("node rank 1, local rank 0 (pod ", 1)[1].split(")", 1)[0]
    pod, node = hung.split(" on ")
    assert placed.get(pod) == node, (hung, placed)
    assert f"is not waiting for its peers (last finished step {hang_at}); 1 rank(s) wait for it" in event["message"]
    assert "deleted 2 pods" in event["message"] and "(stall restart 1 of 2)" in event["message"], event["message"]
    assert "Stalled" in reasons(training_events(whole, name, ns))

    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    final = status(whole, name, ns)
    assert final["stallRestarts"] == 1
    # The stall is counted against the hung rank's node (issue 28): once is no verdict, a second would be.
    assert [(i["node"], i["stalls"], i["failures"]) for i in final["nodeIncidents"]] == [(node, 1, 0)]
    assert final["nodeIncidents"][0]["last"].startswith(f"the stall after step {hang_at}: node rank 1")
    assert "Stalled" not in {c["type"] for c in final["conditions"]}
    # Resumed from the checkpoint before the hang, every step trained, same losses.
    resumed = [int(m) for m in RESUMED.findall(trainer_logs(whole, name, ns))]
    assert resumed == [10], resumed
    assert_resumed_exactly(step_losses(whole, name, ns), max_steps, interval, 10)
    assert "StallCleared" in reasons(training_events(whole, name, ns))
    assert checkpoint_steps(whole, ns) == [20, 30, 40]


def test_a_slow_checkpoint_save_is_never_flagged(operator: WholeCluster, ns: str) -> None:
    whole, name, max_steps, interval = operator, "slowsave", 20, 10
    create_claim(whole, ns)
    # The save of step 10 takes 25 s: longer than the 10 s limit for a step, well within the save
    # allowance. The allowances are wider than the other test's: on a loaded machine (CI, two
    # workers) the real save and the first step add seconds, and they are not what is tested here.
    body = with_fault(fsdptraining(name, ns, max_steps=max_steps, interval=interval), "during_save:10:0:sleep25")
    body["spec"]["stall"] |= {"checkpointSeconds": 60}
    whole.cluster.apply(body)
    stalled: list[str] = []

    def done() -> str | None:
        current = status(whole, name, ns)
        cond = {c["type"]: c for c in current.get("conditions", [])}.get("Stalled")
        if cond is not None and cond["status"] == "True":
            stalled.append(cond.get("message", ""))
        phase = current.get("phase")
        return phase if phase in TERMINAL else None

    t0 = time.monotonic()
    assert wait_for(done, 300, "the training to finish", interval=0.5) == "Succeeded"
    assert not stalled, stalled
    assert time.monotonic() - t0 > 25  # the slow save did happen
    assert not {"Stalled", "StallRestart"} & set(reasons(training_events(whole, name, ns)))
    assert "stallRestarts" not in status(whole, name, ns)


EXCLUDER_BINDING = REPO_ROOT / "kustomize" / "components" / "node-exclusion" / "cluster_role_binding.yaml"


@pytest.fixture
def may_exclude(operator: WholeCluster) -> Iterator[None]:
    """components/node-exclusion on the cluster-wide install; afterwards no node keeps our taint."""
    operator.kubectl("apply", "-f", str(EXCLUDER_BINDING))
    yield
    operator.kubectl("delete", "-f", str(EXCLUDER_BINDING), "--ignore-not-found", check=False)
    for node in ("gpu-0", "gpu-1"):
        operator.kubectl("taint", "node", node, f"{EXCLUDED_NODE_TAINT}-", check=False)
        operator.kubectl("label", "node", node, f"{EXCLUDED_NODE_LABEL}-", check=False)
        marks = (f"{EXCLUDED_UNTIL_ANNOTATION}-", f"{EXCLUDED_BY_ANNOTATION}-")
        operator.kubectl("annotate", "node", node, *marks, check=False)


@pytest.mark.usefixtures("gone_after", "may_exclude")
def test_a_straggler_node_is_excluded_and_the_training_resumes_elsewhere(operator: WholeCluster, ns: str) -> None:
    """A straggler end to end: every rank's lateness read by the operator, its node named and (onSuspectNode exclude)
    tainted, the pod re-created on the other GPU node, resumed from its checkpoint, Succeeded."""
    whole, name, max_steps, interval, slow_from = operator, "exclude", 80, 10, 3
    create_claim(whole, ns)
    body = fsdptraining(name, ns, max_steps=max_steps, interval=interval, nodes=1)
    # One pod, two ranks: its second rank is the straggler, so its node is the suspect.
    body["spec"]["resources"]["gpusPerNode"] = 2
    body["spec"]["health"] = {"onSuspectNode": "exclude", "excludeSeconds": 600}
    body["spec"]["env"] = [{"name": ENV_TRAINER_FAULT, "value": f"after_step:{slow_from}:1:slow0.5"}]
    whole.cluster.apply(body)
    wait_for(lambda: last_step(whole, name, ns) >= slow_from, 300, f"step {slow_from}")
    t_slow = time.monotonic()
    (first,) = [p for p in whole.list("pods", ns) if not p["metadata"].get("deletionTimestamp")]
    bad = first["spec"]["nodeName"]

    def excluded() -> dict[str, Any] | None:
        found = [e for e in training_events(whole, name, ns) if e["reason"] == "NodeExcluded"]
        return found[0] if found else None

    try:
        event = wait_for(excluded, 150, "a NodeExcluded Event")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{json.dumps(status(whole, name, ns), indent=1)}") from e
    record("straggler_excluded_s", time.monotonic() - t_slow)
    # The slow rank, with its pod and node; not its healthy peer on the same node.
    pod = first["metadata"]["name"]
    assert event["message"].startswith(f"excluded node {bad} (straggler: node rank 0, local rank 1 (pod {pod}) "), event
    assert event["message"].count("straggler:") == 1 and "kept its peers waiting" in event["message"], event
    assert "deleted 1 pods to resume from" in event["message"] and "(excluded 1 of at most 2)" in event["message"]
    node = whole.get("node", bad) or {}
    assert {"key": EXCLUDED_NODE_TAINT, "value": "suspect", "effect": "NoSchedule"} in node["spec"]["taints"]

    def elsewhere() -> dict[str, Any] | None:
        pods = [p for p in whole.list("pods", ns) if not p["metadata"].get("deletionTimestamp")]
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return running[0] if running and running[0]["metadata"]["uid"] != first["metadata"]["uid"] else None

    moved = wait_for(elsewhere, 120, "the pod running again")
    record("straggler_fault_to_running_elsewhere_s", time.monotonic() - t_slow)
    assert moved["spec"]["nodeName"] != bad, moved["spec"]["nodeName"]
    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    final = status(whole, name, ns)
    assert [e["node"] for e in final["excludedNodes"]] == [bad]
    assert "straggler: node rank 0, local rank 1" in final["excludedNodes"][0]["reason"]
    # Resumed where the excluded pod stopped: SIGTERM on its deletion saved that step (or, had the
    # save not fit the grace period, the last interval's). The slow fault does not fire again.
    logs = trainer_logs(whole, name, ns)
    resumed, stopped = [int(m) for m in RESUMED.findall(logs)], [int(m) for m in STOPPED.findall(logs)]
    assert len(resumed) == 1 and resumed[0] > slow_from, resumed
    assert resumed[0] in stopped or resumed[0] % interval == 0, (resumed, stopped)
