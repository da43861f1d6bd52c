"""Queued trainings (spec.scheduling): the job Kueue sees, and the status read from Kueue's Workload.

The Workloads here carry the conditions and messages Kueue v0.17.0 writes
(apis/kueue/v1beta2/workload_types.go, pkg/scheduler/flavorassigner); the
whole-cluster tests (tests/e2e/test_kueue.py) run the real Kueue.
"""

from __future__ import annotations

from typing import Any

from fsdp_api.contract import KUEUE_HOLD_ANNOTATION, NOT_MANAGED_BY_KUEUE
from fsdp_operator.controller.queueing import (
    NODE_LEVELS,
    Placement,
    let_through,
    nodes_to_resolve,
    owning_job,
    placement,
    queue_state,
    trim_workload,
)
from fsdp_operator.controller.status.compute import Observations, compute_status, transition_events

from tests.operator.render_fixtures import job_of, objects
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
    st = compute_status(facts(**QUEUED), held, None, Observations(queue=state, now=NOW))
    assert conditions_of(st)["Admitted"].reason == NOT_MANAGED_BY_KUEUE
    assert st.phase == "Queued" and st.message == state.message


def test_a_workload_is_tied_to_its_job_and_trimmed() -> None:
    assert owning_job(PENDING)["name"] == "llama"
    assert owning_job({"metadata": {"ownerReferences": [{"kind": "Job", "controller": True}]}}) is None
    trimmed = trim_workload(workload(active=False))
    assert trimmed["spec"] == {"active": False, "queueName": "team-a"}


# --- the status ------------------------------------------------------------------------------


def test_a_job_kueue_holds_is_queued_with_kueues_reason() -> None:
    st = compute_status(
        facts(**QUEUED), job(suspend=True), None, Observations(queue=queue_state(PENDING, "team-a"), now=NOW)
    )
    assert st.phase == "Queued"
    assert st.message == PENDING_MESSAGE
    admitted = conditions_of(st)["Admitted"]
    assert (admitted.status, admitted.reason, admitted.message) == ("False", "Pending", PENDING_MESSAGE)
    # No pods: nothing about scheduling or starting them.
    assert "Schedulable" not in conditions_of(st) and "PodsStarted" not in conditions_of(st)
    assert ("Normal", "Queued") in [(e.type, e.reason) for e in transition_events(None, st)]


def test_an_admitted_job_runs_and_says_so() -> None:
    running = job({"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"})
    st = compute_status(facts(**QUEUED), running, None, Observations(queue=queue_state(ADMITTED, "team-a"), now=NOW))
    assert st.phase == "Running"
    assert conditions_of(st)["Admitted"].status == "True"


def test_a_preempted_job_is_queued_again_with_a_warning() -> None:
    before = compute_status(facts(**QUEUED), job(), None, Observations(queue=queue_state(ADMITTED, "team-a"), now=NOW))
    previous = before.model_dump(by_alias=True, exclude_none=True, mode="json")
    st = compute_status(
        facts(**QUEUED), job(suspend=True), previous, Observations(queue=queue_state(PREEMPTED, "team-a"), now=NOW)
    )
    assert st.phase == "Queued"
    assert st.message == f"Preempted: {PREEMPTED_MESSAGE}"
    evicted = conditions_of(st)["Evicted"]
    assert (evicted.status, evicted.reason) == ("True", "Preempted")
    events = [(e.type, e.reason) for e in transition_events(previous, st)]
    assert ("Warning", "Preempted") in events and ("Normal", "Queued") in events


def test_the_users_suspend_on_a_queued_training_is_suspended_not_queued() -> None:
    deactivated = workload(wl_cond("Evicted", "True", "Deactivated", "The workload is deactivated"), active=False)
    st = compute_status(
        facts(suspend=True, **QUEUED),
        job(suspend=True),
        None,
        Observations(queue=queue_state(deactivated, "team-a"), now=NOW),
    )
    assert st.phase == "Suspended"


def test_a_training_without_a_queue_has_no_kueue_conditions() -> None:
    st = compute_status(facts(), job(suspend=True), None, Observations(queue=None, now=NOW))
    assert st.phase == "Suspended"
    assert "Admitted" not in conditions_of(st) and "Evicted" not in conditions_of(st)


# --- topology-aware scheduling (spec.scheduling.topology) -------------------------------------

LAYER = "topology.k8s.aws/network-node-layer-{}"
TOPOLOGY = {
    "scheduling": {"queue": "team-a", "topology": {"level": "network-layer-2"}},
    "resources": {"nodes": 2, "gpusPerNode": 8, "instanceTypes": ["p5.48xlarge"]},
}


def test_a_topology_request_rides_on_the_pod_template_of_either_backend() -> None:
    pytorchjob = objects(**TOPOLOGY)["PyTorchJob"]
    pod_meta = pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]
    assert pod_meta["annotations"]["kueue.x-k8s.io/podset-required-topology"] == LAYER.format(2)
    trainjob = objects(backend="trainjob", **TOPOLOGY)["TrainJob"]
    (patch,) = trainjob["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    annotations = replicated["template"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/podset-required-topology"] == LAYER.format(2)
    preferred = {**TOPOLOGY, "scheduling": {"queue": "team-a", "topology": {"level": "rack", "mode": "preferred"}}}
    pod_meta = objects(**preferred)["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]
    assert pod_meta["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] == "rack"
    assert "kueue.x-k8s.io/podset-required-topology" not in pod_meta["annotations"]


def admitted_with(
    slices: list[dict[str, Any]], request: dict[str, str], levels: list[str] | None = None
) -> dict[str, Any]:
    """An admitted Workload with a TopologyAssignment as Kueue v0.17.0 writes it (v1beta2 slices)."""
    wl = workload(*ADMITTED["status"]["conditions"])
    wl["spec"]["podSets"] = [{"name": "worker", "count": 2, "topologyRequest": request}]
    levels = levels or [LAYER.format(1), LAYER.format(2), LAYER.format(3), "kubernetes.io/hostname"]
    wl["status"]["admission"] = {
        "clusterQueue": "cq",
        "podSetAssignments": [{"name": "worker", "topologyAssignment": {"levels": levels, "slices": slices}}],
    }
    return wl


ONE_DOMAIN = [
    {
        "domainCount": 2,
        "valuesPerLevel": [
            {"universal": "nn-top"},
            {"universal": "nn-mid"},
            {"individual": {"prefix": "nn-", "roots": ["a", "b"]}},
            {"individual": {"prefix": "gpu-", "roots": ["0", "1"]}},
        ],
        "podCounts": {"universal": 1},
    }
]


def test_the_status_names_the_domain_kueue_assigned_at_the_requested_level() -> None:
    wl = admitted_with(
        ONE_DOMAIN, {"required": LAYER.format(2), "podIndexLabel": "training.kubeflow.org/replica-index"}
    )
    assert placement(trim_workload(wl)) == Placement(LAYER.format(2), ("nn-mid",))
    st = compute_status(
        facts(**TOPOLOGY), job(), None, Observations(queue=queue_state(trim_workload(wl), "team-a"), now=NOW)
    )
    assert st.topology is not None
    assert (st.topology.level, st.topology.domains) == (LAYER.format(2), ["nn-mid"])
    # A level below shows each pod's domain; one Kueue spread over several is listed as such.
    assert placement(admitted_with(ONE_DOMAIN, {"required": LAYER.format(3)})).domains == ("nn-a", "nn-b")


def test_a_preferred_request_that_fit_nowhere_is_shown_at_the_top_level() -> None:
    spread = [
        {
            **ONE_DOMAIN[0],
            "valuesPerLevel": [{"individual": {"roots": ["nn-x", "nn-y"]}}, *ONE_DOMAIN[0]["valuesPerLevel"][1:]],
        }
    ]
    placed = placement(admitted_with(spread, {"preferred": "rack"}))
    assert placed == Placement(LAYER.format(1), ("nn-x", "nn-y"))


def test_no_placement_before_admission_or_after_an_eviction() -> None:
    assert placement(PENDING) is None
    st = compute_status(
        facts(**TOPOLOGY), job(suspend=True), None, Observations(queue=queue_state(PREEMPTED, "team-a"), now=NOW)
    )
    assert st.topology is None
    assert queue_state(PENDING, "team-a").placement is None


def test_an_assignment_of_nodes_only_is_shown_by_the_nodes_domain_once_their_labels_are_read() -> None:
    """Kueue v0.17.0 keeps only the hostname level when the Topology ends with it (seen in the e2e)."""
    nodes_only = [
        {
            "domainCount": 2,
            "valuesPerLevel": [{"individual": {"prefix": "gpu-", "roots": ["0", "1"]}}],
            "podCounts": {"universal": 1},
        }
    ]
    wl = trim_workload(admitted_with(nodes_only, {"required": LAYER.format(2)}, ["kubernetes.io/hostname"]))
    assert nodes_to_resolve(wl) == (LAYER.format(2), ["gpu-0", "gpu-1"])
    # Before the nodes are read (or where the operator may not list nodes): the nodes themselves.
    assert placement(wl) == Placement("kubernetes.io/hostname", ("gpu-0", "gpu-1"))
    wl[NODE_LEVELS] = {"gpu-0": "nn-mid", "gpu-1": "nn-mid"}
    assert placement(wl) == Placement(LAYER.format(2), ("nn-mid",))
    assert nodes_to_resolve(admitted_with(ONE_DOMAIN, {"required": LAYER.format(2)})) is None
