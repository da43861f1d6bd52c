"""A TrainJob's status in the PyTorchJob's terms (backends/trainjob_view.py), and the training's status from it.

The TrainJobs here are what Kubeflow Trainer v2.3.0 writes: metav1 conditions
Suspended (reason Suspended / Resumed, pkg/controller/trainjob_controller.go
setSuspendedCondition), Complete and Failed (copied from the JobSet's Completed
and Failed, pkg/runtime/framework/plugins/jobset/jobset.go Status) and
``jobsStatus`` (JobSet's ReplicatedJobStatus: counts of child Jobs). They go
through ``reconcile.trim_job`` as the job watch delivers them, then
``status.compute_status`` as in tests/operator/status/test_status.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_api.status import ReplicaStatus
from fsdp_operator.backends.trainjob_view import trainjob_status
from fsdp_operator.controller.queueing import QueueState
from fsdp_operator.controller.reconcile import trim_job
from fsdp_operator.controller.status.compute import (
    GENERATION_ANNOTATION,
    Observations,
    ReconcileOutcome,
    TrainingFacts,
    compute_status,
    job_phase,
)

NOW = "2026-01-02T05:00:00Z"
CREATED = "2026-01-02T03:00:00Z"
SUSPENDED_AT = "2026-01-02T03:10:00Z"
RESUMED_AT = "2026-01-02T03:30:00Z"
DONE_AT = "2026-01-02T04:45:00Z"
# Our runtime's one replicated job (and container): Trainer v2's fixed name for the trainer nodes.
NODE = "node"
APPLIED = ReconcileOutcome(True, "Applied")


def training(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {
            "backend": "trainjob",
            "image": "trainer:1",
            "model": {"preset": "tiny"},
            "training": {"maxSteps": 10},
            "resources": {"nodes": 2, "gpusPerNode": 8},
            **spec,
        },
    }


def facts(**spec: Any) -> TrainingFacts:
    return TrainingFacts.from_body(training(**spec))


def cond(type_: str, status: str = "True", reason: str = "", message: str = "", time: str = NOW) -> dict[str, Any]:
    """A metav1.Condition (no lastUpdateTime, unlike Kubeflow v1's JobCondition)."""
    return {"type": type_, "status": status, "reason": reason or type_, "message": message, "lastTransitionTime": time}


def node_jobs(active: int = 0, ready: int = 0, succeeded: int = 0, failed: int = 0, suspended: int = 0) -> list[Any]:
    """jobsStatus of our runtime's one replicated job "node" (counts of its child Jobs: one)."""
    return [
        {
            "name": "node",
            "active": active,
            "ready": ready,
            "succeeded": succeeded,
            "failed": failed,
            "suspended": suspended,
        }
    ]


def trainjob(*conditions: dict[str, Any], suspend: bool = False, jobs: list[Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if conditions:
        status["conditions"] = list(conditions)
    if jobs is not None:
        status["jobsStatus"] = jobs
    body: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "llama",
            "namespace": "ml",
            "uid": "tj-1",
            "resourceVersion": "42",
            "creationTimestamp": CREATED,
            "annotations": {GENERATION_ANNOTATION: "1"},
        },
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": "fsdp-torchrun",
            },
            "suspend": suspend,
            "trainer": {"image": "trainer:1", "numNodes": 2, "numProcPerNode": 8},
        },
    }
    if status:
        body["status"] = status
    return body


def status_of(job: dict[str, Any], **kw: Any) -> Any:
    f = kw.pop("training_facts", None) or facts()
    return compute_status(f, trim_job(job), None, Observations(outcome=APPLIED, now=NOW, **kw))


def types(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


# --- trim_job --------------------------------------------------------------------------------------


def test_trim_job_keeps_the_kind_and_reads_suspend_from_the_trainjobs_spec() -> None:
    trimmed = trim_job(trainjob(suspend=True))
    assert trimmed["kind"] == "TrainJob"
    assert trimmed["spec"] == {"runPolicy": {"suspend": True}}
    assert trimmed["metadata"]["creationTimestamp"] == CREATED
    assert trimmed["metadata"]["annotations"] == {GENERATION_ANNOTATION: "1"}
    assert trim_job(trainjob())["spec"] == {"runPolicy": {"suspend": False}}
    # The status is the translated one, not Trainer's.
    assert "jobsStatus" not in trim_job(trainjob(jobs=node_jobs(active=1)))["status"]


# --- just created ---------------------------------------------------------------------------------


def test_a_trainjob_without_status_is_created() -> None:
    view = trainjob_status(trainjob())
    assert [(c["type"], c["status"]) for c in view["conditions"]] == [("Created", "True")]
    assert types(view)["Created"]["lastTransitionTime"] == CREATED
    assert view["replicaStatuses"] == {}
    assert view["startTime"] == CREATED
    assert "completionTime" not in view

    s = status_of(trainjob())
    assert s.phase == "Created"
    assert s.message == "TrainJob llama created; waiting for its pods"
    assert s.job_name == "llama"
    assert s.observed_generation == 1
    created = next(c for c in s.conditions if c.type == "Created")
    assert (created.status, created.last_transition_time) == ("True", CREATED)
    assert s.completion_time is None


def test_a_trainjob_whose_child_job_is_not_active_yet_is_still_created() -> None:
    s = status_of(trainjob(jobs=node_jobs(active=0)))
    assert s.phase == "Created"
    assert not any(c.type == "Running" for c in s.conditions)


# --- running ----------------------------------------------------------------------------------------


def test_an_active_child_job_is_running() -> None:
    view = trainjob_status(trainjob(jobs=node_jobs(active=1, ready=1)))
    assert types(view)["Running"]["status"] == "True"
    s = status_of(trainjob(jobs=node_jobs(active=1, ready=1)))
    assert s.phase == "Running"
    assert s.message == "TrainJob llama is running"
    running = next(c for c in s.conditions if c.type == "Running")
    assert running.status == "True"
    assert s.start_time == CREATED
    assert s.completion_time is None


def test_replica_statuses_are_the_child_job_counts_per_replicated_job() -> None:
    """jobsStatus counts child Jobs (our runtime has one Job for all nodes), not pods: a 2-node job shows active 1."""
    s = status_of(trainjob(jobs=node_jobs(active=1, ready=1)))
    assert s.replica_statuses == {NODE: ReplicaStatus(active=1, succeeded=0, failed=0)}
    # One entry per replicated job, should a runtime have several; any active one makes it Running.
    view = trainjob_status(trainjob(jobs=[*node_jobs(), {"name": "init", "active": 1, "succeeded": 2}]))
    assert view["replicaStatuses"] == {
        NODE: {"active": 0, "succeeded": 0, "failed": 0},
        "init": {"active": 1, "succeeded": 2, "failed": 0},
    }
    assert types(view)["Running"]["status"] == "True"


# --- suspended ----------------------------------------------------------------------------------------


def test_a_suspended_trainjob_is_suspended_with_trainers_message() -> None:
    job = trainjob(
        cond("Suspended", reason="Suspended", message="TrainJob is suspended", time=SUSPENDED_AT), suspend=True
    )
    s = status_of(job, training_facts=facts(suspend=True))
    assert s.phase == "Suspended"
    assert s.message == "TrainJob is suspended"
    suspended = next(c for c in s.conditions if c.type == "Suspended")
    assert (suspended.status, suspended.reason, suspended.last_transition_time) == ("True", "Suspended", SUSPENDED_AT)


def test_suspend_requested_before_trainer_acknowledges_it() -> None:
    s = status_of(trainjob(suspend=True, jobs=node_jobs(active=1)), training_facts=facts(suspend=True))
    assert s.phase == "Suspended"
    assert s.message == "TrainJob llama is suspended"
    suspended = next(c for c in s.conditions if c.type == "Suspended")
    assert (suspended.reason, suspended.message) == ("SuspendRequested", "suspend is set on the TrainJob")


def test_pods_still_active_while_suspended_do_not_make_it_running() -> None:
    job = trainjob(cond("Suspended", time=SUSPENDED_AT), suspend=True, jobs=node_jobs(active=1))
    assert "Running" not in types(trainjob_status(job))
    assert job_phase(trim_job(job))[0] == "Suspended"


def test_a_queued_trainjob_held_by_kueue_is_queued() -> None:
    job = trainjob(cond("Suspended", time=SUSPENDED_AT), suspend=True)
    queue = QueueState(False, "Pending", "ClusterQueue team-a is at its nvidia.com/gpu quota")
    s = status_of(job, training_facts=facts(scheduling={"queue": "team-a"}), queue=queue)
    assert s.phase == "Queued"
    assert s.message == "ClusterQueue team-a is at its nvidia.com/gpu quota"


# --- completed and failed ------------------------------------------------------------------------------


def test_a_complete_trainjob_succeeded_with_its_completion_time() -> None:
    job = trainjob(
        cond("Complete", reason="AllJobsCompleted", message="jobset completed successfully", time=DONE_AT),
        jobs=node_jobs(succeeded=1),
    )
    view = trainjob_status(job)
    assert types(view)["Succeeded"]["status"] == "True"
    assert "Complete" not in types(view)
    s = status_of(job)
    assert s.phase == "Succeeded"
    assert s.message == "jobset completed successfully"
    assert s.completion_time == DONE_AT
    assert s.start_time == CREATED
    # The trainer exits 0 only after maxSteps and its final checkpoint.
    assert (s.step, s.checkpoint.last_step) == (10, 10)


def test_a_complete_trainjob_with_a_lingering_active_job_is_not_running() -> None:
    job = trainjob(cond("Complete", time=DONE_AT), jobs=node_jobs(active=1, succeeded=1))
    assert "Running" not in types(trainjob_status(job))
    assert job_phase(trim_job(job))[0] == "Succeeded"


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts"),
        ("DeadlineExceeded", "TrainJob exceeded its active deadline"),
    ],
)
def test_a_failed_trainjob_failed_with_its_message(reason: str, message: str) -> None:
    job = trainjob(cond("Failed", reason=reason, message=message, time=DONE_AT), jobs=node_jobs(failed=1))
    s = status_of(job)
    assert s.phase == "Failed"
    assert s.message == message
    assert s.completion_time == DONE_AT
    failed = next(c for c in s.conditions if c.type == "Failed")
    assert (failed.status, failed.reason, failed.message) == ("True", reason, message)
    assert s.replica_statuses == {NODE: ReplicaStatus(active=0, succeeded=0, failed=1)}


def test_failed_wins_over_suspended() -> None:
    job = trainjob(cond("Suspended", time=SUSPENDED_AT), cond("Failed", message="boom", time=DONE_AT), suspend=True)
    assert job_phase(trim_job(job)) == ("Failed", "boom")


# --- resumed --------------------------------------------------------------------------------------------


def test_a_resumed_trainjob_started_when_it_was_resumed() -> None:
    job = trainjob(
        cond("Suspended", status="False", reason="Resumed", message="TrainJob is resumed", time=RESUMED_AT),
        jobs=node_jobs(active=1),
    )
    view = trainjob_status(job)
    assert view["startTime"] == RESUMED_AT
    s = status_of(job)
    assert s.phase == "Running"
    assert s.start_time == RESUMED_AT
    suspended = next(c for c in s.conditions if c.type == "Suspended")
    assert (suspended.status, suspended.reason) == ("False", "Resumed")


def test_a_trainjob_being_resumed_has_no_running_condition_until_a_job_is_active() -> None:
    job = trainjob(cond("Suspended", status="False", reason="Resumed", time=RESUMED_AT), jobs=node_jobs(active=0))
    s = status_of(job)
    assert s.phase == "Created"
    assert s.start_time == RESUMED_AT
