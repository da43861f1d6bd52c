"""Queued trainings (spec.scheduling): the job Kueue sees, and the status read from Kueue's Workload.

The Workloads here carry the conditions and messages Kueue v0.17.0 writes
(apis/kueue/v1beta2/workload_types.go, pkg/scheduler/flavorassigner); the
whole-cluster tests (tests/e2e/test_kueue.py) run the real Kueue.
"""

from __future__ import annotations

from typing import Any

from fsdp_api.contract import KUEUE_HOLD_ANNOTATION, NOT_MANAGED_BY_KUEUE
from fsdp_operator.controller.queueing import let_through, owning_job, queue_state, trim_workload
from fsdp_operator.controller.status import compute_status, transition_events

from tests.operator.render_fixtures import job_of
from tests.operator.status_fixtures import NOW, conditions_of, facts, job

QUEUED = {"scheduling": {"queue": "team-a", "priorityClass": "low"}}
PENDING_MESSAGE = (
    "couldn't assign flavors to pod set worker: "
    "insufficient unused quota for nvidia.com/gpu in flavor gpu, 2 more needed"
)
PREEMPTED_MESSAGE = (
    "Preempted to accommodate a workload (UID: 1a, JobUID: 2b) due to prioritization in the ClusterQueue; "
    "preemptor path: /cq; preemptee path: /cq"
)


def wl_cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": NOW}


def workload(*conditions: dict[str, Any], active: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queueName": "team-a"}
    if active is not None:
        spec["active"] = active
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "pytorchjob-llama-d9e5e",
            "namespace": "ml",
            "ownerReferences": [{"kind": "PyTorchJob", "name": "llama", "uid": "j-1", "controller": True}],
        },
        "spec": spec,
        "status": {"conditions": list(conditions)},
    }


PENDING = workload(wl_cond("QuotaReserved", "False", "Pending", PENDING_MESSAGE))
ADMITTED = workload(
    wl_cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
    wl_cond("Admitted", "True", "Admitted", "The workload is admitted"),
)
PREEMPTED = workload(
    wl_cond("Admitted", "False", "NoReservation", "The workload has no reservation"),
    wl_cond("Evicted", "True", "Preempted", PREEMPTED_MESSAGE),
    wl_cond("Preempted", "True", "InClusterQueue", PREEMPTED_MESSAGE),
    wl_cond("Requeued", "True", "Preempted", PREEMPTED_MESSAGE),
)


# --- the job Kueue sees --------------------------------------------------------------------


def test_a_queued_job_carries_kueues_labels_and_leaves_suspend_to_kueue() -> None:
    queued, plain = job_of(**QUEUED), job_of()
    labels = queued["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "low"
    # Applying suspend at all would take it from Kueue (or conflict with its field manager).
    assert "suspend" not in queued["spec"]["runPolicy"]
    assert plain["spec"]["runPolicy"]["suspend"] is False
    assert not any(k.startswith("kueue.x-k8s.io/") for k in plain["metadata"]["labels"])
    # A suspended queued training still leaves the field to Kueue: the Workload carries the intent.
    assert "suspend" not in job_of(suspend=True, **QUEUED)["spec"]["runPolicy"]


def test_a_queued_job_kueue_did_not_suspend_at_creation_is_one_it_does_not_manage() -> None:
    created = job_of(**QUEUED)  # as it comes back from a create that Kueue's webhook did not touch
    assert let_through(created)
    created["spec"]["runPolicy"]["suspend"] = True  # what Kueue's webhook does to a kind it manages
    assert not let_through(created)
    # Not queued: nothing for Kueue to manage.
    assert not let_through(job_of())


# --- reading the Workload --------------------------------------------------------------------


def test_queue_state_says_why_it_waits_or_that_it_was_preempted() -> None:
    assert queue_state(None, "team-a").reason == "NoWorkload"
    pending = queue_state(PENDING, "team-a")
    assert (pending.admitted, pending.reason, pending.message) == (False, "Pending", PENDING_MESSAGE)
    admitted = queue_state(ADMITTED, "team-a")
    assert (admitted.admitted, admitted.reason) == (True, "Admitted")
    preempted = queue_state(PREEMPTED, "team-a")
    assert (preempted.admitted, preempted.reason) == (False, "Preempted")
    assert preempted.evicted is not None and preempted.evicted["status"] == "True"
    assert preempted.message == f"Preempted: {PREEMPTED_MESSAGE}"


def test_a_held_job_without_a_workload_says_kueue_does_not_manage_it_and_what_to_change() -> None:
    held = job(suspend=True)
    held["metadata"]["annotations"][KUEUE_HOLD_ANNOTATION] = "Kueue does not manage pytorchjobs"
    state = queue_state(None, "team-a", held)
    assert (state.admitted, state.reason) == (False, NOT_MANAGED_BY_KUEUE)
    assert state.message.startswith("Kueue did not suspend PyTorchJob llama when it was created")
    assert "outside LocalQueue team-a" in state.message
    assert "Add kubeflow.org/pytorchjob to integrations.frameworks" in state.message
    assert state.message.endswith("or use spec.backend: trainjob")
    # Once Kueue manages the kind it makes the Workload: that one says where the job stands.
    assert queue_state(PENDING, "team-a", held).reason == "Pending"
    # An unmarked job without a Workload only waits for Kueue to make one.
    assert queue_state(None, "team-a", job(suspend=True)).reason == "NoWorkload"
    st = compute_status(facts(**QUEUED), held, None, queue=state, now=NOW)
    assert conditions_of(st)["Admitted"].reason == NOT_MANAGED_BY_KUEUE
    assert st.phase == "Queued" and st.message == state.message


def test_a_workload_is_tied_to_its_job_and_trimmed() -> None:
    assert owning_job(PENDING)["name"] == "llama"
    assert owning_job({"metadata": {"ownerReferences": [{"kind": "Job", "controller": True}]}}) is None
    trimmed = trim_workload(workload(active=False))
    assert trimmed["spec"] == {"active": False, "queueName": "team-a"}


# --- the status ------------------------------------------------------------------------------


def test_a_job_kueue_holds_is_queued_with_kueues_reason() -> None:
    st = compute_status(facts(**QUEUED), job(suspend=True), None, queue=queue_state(PENDING, "team-a"), now=NOW)
    assert st.phase == "Queued"
    assert st.message == PENDING_MESSAGE
    admitted = conditions_of(st)["Admitted"]
    assert (admitted.status, admitted.reason, admitted.message) == ("False", "Pending", PENDING_MESSAGE)
    # No pods: nothing about scheduling or starting them.
    assert "Schedulable" not in conditions_of(st) and "PodsStarted" not in conditions_of(st)
    assert ("Normal", "Queued") in [(e.type, e.reason) for e in transition_events(None, st)]


def test_an_admitted_job_runs_and_says_so() -> None:
    running = job({"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"})
    st = compute_status(facts(**QUEUED), running, None, queue=queue_state(ADMITTED, "team-a"), now=NOW)
    assert st.phase == "Running"
    assert conditions_of(st)["Admitted"].status == "True"


def test_a_preempted_job_is_queued_again_with_a_warning() -> None:
    before = compute_status(facts(**QUEUED), job(), None, queue=queue_state(ADMITTED, "team-a"), now=NOW)
    previous = before.model_dump(by_alias=True, exclude_none=True, mode="json")
    st = compute_status(facts(**QUEUED), job(suspend=True), previous, queue=queue_state(PREEMPTED, "team-a"), now=NOW)
    assert st.phase == "Queued"
    assert st.message == f"Preempted: {PREEMPTED_MESSAGE}"
    evicted = conditions_of(st)["Evicted"]
    assert (evicted.status, evicted.reason) == ("True", "Preempted")
    events = [(e.type, e.reason) for e in transition_events(previous, st)]
    assert ("Warning", "Preempted") in events and ("Normal", "Queued") in events


def test_the_users_suspend_on_a_queued_training_is_suspended_not_queued() -> None:
    deactivated = workload(wl_cond("Evicted", "True", "Deactivated", "The workload is deactivated"), active=False)
    st = compute_status(
        facts(suspend=True, **QUEUED), job(suspend=True), None, queue=queue_state(deactivated, "team-a"), now=NOW
    )
    assert st.phase == "Suspended"


def test_a_training_without_a_queue_has_no_kueue_conditions() -> None:
    st = compute_status(facts(), job(suspend=True), None, queue=None, now=NOW)
    assert st.phase == "Suspended"
    assert "Admitted" not in conditions_of(st) and "Evicted" not in conditions_of(st)
