"""Queued trainings end to end: the real Kueue (built from its Go module) admits, queues and preempts
FSDPTrainings on the whole local cluster, and the operator mirrors its Workloads into the status."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fsdp_localcluster.kueue import Kueue
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

from tests.e2e.namespaces import own_namespace
from tests.e2e.queues import INSUFFICIENT, queue_objects
from tests.e2e.timings import record
from tests.e2e.training import (
    RESUMED,
    TERMINAL,
    assert_resumed_exactly,
    conditions,
    create_claim,
    dump,
    fsdptraining,
    last_step,
    restart_operator,
    saved_on_sigterm,
    status,
    step_losses,
    trainer_logs,
    wait_phase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# One training of two pods (one fake GPU each) takes the whole quota.


@pytest.fixture(scope="module")
def kueue(operator: WholeCluster) -> Iterator[Kueue]:
    """Kueue next to the session's control plane; the operator restarted so that it watches Workloads.

    The operator resolves the resources it watches when it starts (docs/kueue.md:
    install Kueue first, or restart the operator after installing it).
    """
    k = Kueue(operator.control_plane).start()
    restart_operator(operator)
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def ns(kueue: Kueue, operator: WholeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace with a LocalQueue ``team`` on a ClusterQueue of its own with GPU_QUOTA GPUs."""
    for name in own_namespace(operator, "q-", request):
        for obj in queue_objects(name):
            operator.cluster.apply(obj)
        yield name


def queued(name: str, ns: str, *, priority: str | None = None, **kwargs: Any) -> dict[str, Any]:
    body = fsdptraining(name, ns, **kwargs)
    body["spec"]["scheduling"] = {"queue": "team", **({"priorityClass": priority} if priority else {})}
    return body


def admitted(whole: WholeCluster, name: str, ns: str) -> str | None:
    return conditions(status(whole, name, ns)).get("Admitted", {}).get("status")


def test_a_second_training_waits_in_the_queue_with_kueues_reason_then_runs(operator: WholeCluster, ns: str) -> None:
    whole = operator
    create_claim(whole, ns, "ckpt-a")
    create_claim(whole, ns, "ckpt-b")
    t0 = time.monotonic()
    # Long enough that the second one is seen waiting (the tiny model trains about 10 steps a second).
    whole.cluster.apply(queued("first", ns, max_steps=80, interval=20, claim="ckpt-a"))
    wait_for(lambda: last_step(whole, "first", ns) >= 1, 240, "the first training's first step")
    record("queued_apply_to_first_step_s", time.monotonic() - t0)
    assert admitted(whole, "first", ns) == "True", dump(status(whole, "first", ns))

    whole.cluster.apply(queued("second", ns, max_steps=10, interval=5, claim="ckpt-b"))
    st = wait_for(
        lambda: (s := status(whole, "second", ns)).get("phase") == "Queued" and INSUFFICIENT.search(s["message"]) and s,
        60,
        "the second training to be Queued with Kueue's reason",
    )
    cond = conditions(st)["Admitted"]
    assert (cond["status"], cond["reason"]) == ("False", "Pending"), dump(st)
    assert "nvidia.com/gpu" in cond["message"]
    assert not [p for p in whole.list("pods", ns) if p["metadata"]["name"].startswith("second-")]
    printed = whole.kubectl("get", "fsdp", "second", "-n", ns).stdout
    assert "Queued" in printed, printed

    assert wait_phase(whole, "first", ns, TERMINAL, 300) == "Succeeded"
    t_freed = time.monotonic()
    wait_for(lambda: admitted(whole, "second", ns) == "True", 120, "Kueue to admit the second training")
    record("queue_wait_to_admission_s", time.monotonic() - t_freed)
    assert wait_phase(whole, "second", ns, TERMINAL, 300) == "Succeeded"
    assert sorted(step_losses(whole, "second", ns)) == list(range(1, 11))


def test_a_higher_priority_training_preempts_a_lower_one_which_resumes_from_its_checkpoint(
    operator: WholeCluster, ns: str
) -> None:
    # Long enough to be running when the high one preempts it (about 2 steps/s in the pods, and the
    # eviction comes within seconds of step 25); every step after the resume is test time.
    whole, max_steps, interval = operator, 120, 20
    create_claim(whole, ns, "ckpt")
    create_claim(whole, ns, "ckpt-high")
    whole.cluster.apply(queued("low", ns, priority="low", max_steps=max_steps, interval=interval, claim="ckpt"))
    wait_for(lambda: last_step(whole, "low", ns) >= interval + 5, 300, "the low training past its first checkpoint")

    t_preempt = time.monotonic()
    whole.cluster.apply(queued("high", ns, priority="high", max_steps=10, interval=5, claim="ckpt-high"))
    st = wait_for(
        lambda: (
            (s := status(whole, "low", ns)).get("phase") == "Queued"
            and conditions(s).get("Evicted", {}).get("status") == "True"
            and s
        ),
        120,
        "the low training to be preempted and queued again",
    )
    evicted = conditions(st)["Evicted"]
    assert evicted["reason"] == "Preempted" and "Preempted to accommodate" in evicted["message"], dump(st)
    events = whole.kubectl("get", "events", "-n", ns, "--field-selector=involvedObject.name=low").stdout
    assert "Preempted" in events, events
    # SIGTERM from the eviction: the trainer saves where it stands before its pods go.
    wait_for(lambda: not [p for p in whole.list("pods", ns) if p["metadata"]["name"].startswith("low-")], 120, "pods")
    stopped_at = last_step(whole, "low", ns)
    saved = saved_on_sigterm(whole, "low", ns, "ckpt")
    assert stopped_at - saved <= 1, (stopped_at, saved)
    assert wait_phase(whole, "high", ns, TERMINAL, 300) == "Succeeded"

    wait_for(lambda: admitted(whole, "low", ns) == "True", 120, "Kueue to admit the low training again")
    wait_for(lambda: last_step(whole, "low", ns) > stopped_at, 240, "the low training to train again")
    record("preemption_to_resumed_s", time.monotonic() - t_preempt)
    assert wait_phase(whole, "low", ns, TERMINAL, 600) == "Succeeded"
    logs = trainer_logs(whole, "low", ns)
    resumed = [int(m) for m in RESUMED.findall(logs)]
    assert saved in resumed, (saved, resumed, logs[-3000:])
    recomputed = assert_resumed_exactly(step_losses(whole, "low", ns), max_steps, interval, saved)
    record("steps_recomputed_after_preemption", len(recomputed))


def test_suspend_on_a_queued_training_deactivates_its_workload_and_resume_requeues_it(
    operator: WholeCluster, ns: str
) -> None:
    whole = operator
    create_claim(whole, ns, "ckpt")
    whole.cluster.apply(queued("pause", ns, max_steps=400, interval=20, claim="ckpt"))
    wait_for(lambda: last_step(whole, "pause", ns) >= 3, 240, "the training's first steps")
    whole.kubectl("patch", "fsdp", "pause", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    st = wait_for(
        lambda: (s := status(whole, "pause", ns)).get("phase") == "Suspended" and s, 120, "the training to suspend"
    )
    assert conditions(st)["Evicted"]["reason"].startswith("Deactivated"), dump(st)
    workloads = whole.list("workloads.kueue.x-k8s.io", ns)
    assert [w["spec"].get("active") for w in workloads] == [False], workloads
    wait_for(lambda: not [p for p in whole.list("pods", ns) if p["metadata"]["name"].startswith("pause-")], 120, "pods")
    stopped_at = last_step(whole, "pause", ns)
    whole.kubectl("patch", "fsdp", "pause", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: last_step(whole, "pause", ns) > stopped_at, 240, "the training to run again after resume")
    assert admitted(whole, "pause", ns) == "True"
    assert [w["spec"].get("active") for w in whole.list("workloads.kueue.x-k8s.io", ns)] == [True]
    whole.kubectl("delete", "fsdp", "pause", "-n", ns)
