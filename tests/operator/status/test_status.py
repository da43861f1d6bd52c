"""The operator's pure functions: PyTorchJob → FSDPTraining status, patches, events, progress, peering."""

from __future__ import annotations

import asyncio
import copy
import http.server
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from fsdp_api.status import FSDPTrainingStatus
from fsdp_operator.controller.kube import KubeClient
from fsdp_operator.controller.metrics import OperatorMetrics
from fsdp_operator.controller.peering import is_active
from fsdp_operator.controller.progress import (
    TrainerProgress,
    Unreadable,
    node_rank_0_progress,
    parse_trainer_metrics,
    rank0_pod,
    scrape,
)
from fsdp_operator.controller.reconcile import (
    MAX_RETRY_DELAY,
    Runtime,
    newest_job,
    record_pods,
    record_progress,
    retry_delay,
    trim_job,
)
from fsdp_operator.controller.scraper import check_pods_once, waiting_trainings
from fsdp_operator.controller.stall_check import check_stall
from fsdp_operator.controller.status.compute import (
    MAX_MESSAGE,
    EventSpec,
    Observations,
    PodsReport,
    ReconcileOutcome,
    Scheduling,
    Start,
    compute_status,
    config_rejection,
    merge_patch,
    pod_scheduling,
    pod_start,
    status_document,
    status_patch,
    transition_events,
)

from tests.operator.status_fixtures import NOW, conditions_of, facts, job, training

LATER = "2026-01-02T04:00:00Z"
APPLIED = ReconcileOutcome(True, "Applied")


def cond(type_: str, status: str = "True", reason: str = "", message: str = "", time: str = NOW) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason or f"PyTorchJob{type_}",
        "message": message,
        "lastUpdateTime": time,
        "lastTransitionTime": time,
    }


# --- facts -----------------------------------------------------------------------


def test_facts_take_defaults_from_the_api_model() -> None:
    f = facts()
    assert (f.nodes, f.gpus, f.suspend) == (1, 8, False)  # ResourcesSpec: 1 node x 8 GPUs
    assert (f.checkpoint_dir, f.checkpoint_claim) == ("/checkpoints", None)


def test_facts_multiply_nodes_by_gpus_per_node() -> None:
    f = facts(resources={"nodes": 4, "gpusPerNode": 8}, checkpoint={"dir": "/ckpt", "claimName": "ckpt"}, suspend=True)
    assert (f.nodes, f.gpus, f.suspend, f.checkpoint_dir, f.checkpoint_claim) == (4, 32, True, "/ckpt", "ckpt")


# --- phase mapping -----------------------------------------------------------------


def test_no_job_yet_is_pending() -> None:
    s = compute_status(facts(), None, None, Observations(outcome=APPLIED, now=NOW))
    assert s.phase == "Pending"
    assert s.job_name == "llama"
    assert s.replica_statuses == {}


def test_invalid_spec_without_job_is_failed_with_the_validation_message() -> None:
    outcome = ReconcileOutcome(
        False, "InvalidSpec", "spec.fsdp.shardingStrategy: hybrid sharding needs at least 2 nodes"
    )
    s = compute_status(facts(), None, None, Observations(outcome=outcome, now=NOW))
    assert s.phase == "Failed"
    assert s.message == outcome.message
    rec = conditions_of(s)["Reconciled"]
    assert (rec.status, rec.reason, rec.observed_generation) == ("False", "InvalidSpec", 1)


def test_invalid_update_keeps_mirroring_the_running_job() -> None:
    outcome = ReconcileOutcome(False, "InvalidSpec", "bad")
    s = compute_status(facts(), job(cond("Created"), cond("Running")), None, Observations(outcome=outcome, now=NOW))
    assert s.phase == "Running"
    assert conditions_of(s)["Reconciled"].status == "False"


def test_job_without_conditions_is_created() -> None:
    s = compute_status(facts(), job(), None, Observations(outcome=APPLIED, now=NOW))
    assert s.phase == "Created"
    assert "waiting for its pods" in s.message


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ([cond("Created")], "Created"),
        ([cond("Created"), cond("Running")], "Running"),
        ([cond("Created"), cond("Running", "False"), cond("Restarting")], "Restarting"),
        ([cond("Created"), cond("Running", "False"), cond("Succeeded")], "Succeeded"),
        ([cond("Created"), cond("Running", "False"), cond("Failed")], "Failed"),
        ([cond("Created"), cond("Running", "False"), cond("Suspended")], "Suspended"),
        # Resumed by Kubeflow, pods not running yet: back to Created.
        ([cond("Created"), cond("Running", "False"), cond("Suspended", "False", "JobResumed")], "Created"),
        # Terminal states win over everything else.
        ([cond("Running"), cond("Suspended"), cond("Failed")], "Failed"),
        ([cond("Running"), cond("Succeeded")], "Succeeded"),
    ],
)
def test_kubeflow_conditions_map_to_phases(conditions: list[dict[str, Any]], phase: str) -> None:
    assert compute_status(facts(), job(*conditions), None, Observations(now=NOW)).phase == phase


def test_phase_message_comes_from_the_deciding_condition() -> None:
    j = job(cond("Created"), cond("Failed", message="PyTorchJob llama has failed because 1 Worker replica(s) failed."))
    assert (
        compute_status(facts(), j, None, Observations(now=NOW)).message
        == "PyTorchJob llama has failed because 1 Worker replica(s) failed."
    )


def test_suspend_in_the_job_spec_is_suspended_before_kubeflow_acknowledges() -> None:
    s = compute_status(
        facts(suspend=True), job(cond("Created"), cond("Running"), suspend=True), None, Observations(now=NOW)
    )
    assert s.phase == "Suspended"
    c = conditions_of(s)["Suspended"]
    assert (c.status, c.reason) == ("True", "SuspendRequested")


def test_kubeflow_suspended_condition_is_mirrored_with_its_reason() -> None:
    j = job(
        cond("Created"),
        cond("Suspended", reason="JobSuspended", message="PyTorchJob llama is suspended."),
        suspend=True,
    )
    c = conditions_of(compute_status(facts(suspend=True), j, None, Observations(now=NOW)))["Suspended"]
    assert (c.status, c.reason, c.message) == ("True", "JobSuspended", "PyTorchJob llama is suspended.")


def test_suspended_job_that_succeeded_is_succeeded() -> None:
    assert (
        compute_status(facts(), job(cond("Succeeded"), suspend=True), None, Observations(now=NOW)).phase == "Succeeded"
    )


# --- mirrored fields ------------------------------------------------------------------


def test_times_replicas_and_sizes_are_mirrored() -> None:
    j = job(
        cond("Created"),
        cond("Running", "False"),
        cond("Succeeded"),
        startTime="2026-01-02T03:00:00Z",
        completionTime="2026-01-02T05:00:00Z",
        replicaStatuses={
            "Worker": {"active": 0, "succeeded": 4, "selector": "x=y", "labelSelector": {"matchLabels": {}}}
        },
    )
    s = compute_status(facts(resources={"nodes": 4, "gpusPerNode": 8}), j, None, Observations(now=NOW))
    assert (s.start_time, s.completion_time) == ("2026-01-02T03:00:00Z", "2026-01-02T05:00:00Z")
    assert s.replica_statuses["Worker"].model_dump() == {"active": 0, "succeeded": 4, "failed": 0}
    assert (s.nodes, s.gpus, s.job_name) == (4, 32, "llama")


def test_observed_generation_is_the_generation_rendered_into_the_job() -> None:
    s = compute_status(
        facts(generation=3), job(cond("Running"), generation=2), None, Observations(outcome=APPLIED, now=NOW)
    )
    assert s.observed_generation == 2
    by_type = conditions_of(s)
    assert by_type["Running"].observed_generation == 2
    # Reconciled/CheckpointsPersistent describe the spec the operator just read.
    assert by_type["Reconciled"].observed_generation == 3
    assert by_type["CheckpointsPersistent"].observed_generation == 3


def test_kubeflow_conditions_keep_the_jobs_transition_time() -> None:
    s = compute_status(facts(), job(cond("Running", time="2025-12-31T00:00:00Z")), None, Observations(now=NOW))
    assert conditions_of(s)["Running"].last_transition_time == "2025-12-31T00:00:00Z"


def test_own_conditions_move_their_transition_time_only_when_status_flips() -> None:
    first = status_document(compute_status(facts(), job(), None, Observations(outcome=APPLIED, now=NOW)))
    same = compute_status(facts(), job(), first, Observations(outcome=APPLIED, now=LATER))
    assert conditions_of(same)["Reconciled"].last_transition_time == NOW
    failed = compute_status(
        facts(), job(), first, Observations(outcome=ReconcileOutcome(False, "ApplyFailed", "boom"), now=LATER)
    )
    assert conditions_of(failed)["Reconciled"].last_transition_time == LATER


def test_job_event_keeps_the_last_reconcile_outcome() -> None:
    failed = ReconcileOutcome(False, "ApplyFailed", "forbidden")
    first = status_document(compute_status(facts(), job(), None, Observations(outcome=failed, now=NOW)))
    s = compute_status(facts(), job(cond("Running")), first, Observations(outcome=None, now=LATER))
    rec = conditions_of(s)["Reconciled"]
    assert (rec.status, rec.message, rec.last_transition_time) == ("False", "forbidden", NOW)


def test_checkpoints_without_pvc_are_ephemeral() -> None:
    s = compute_status(facts(), job(), None, Observations(now=NOW))
    assert s.checkpoint.ephemeral is True
    c = conditions_of(s)["CheckpointsPersistent"]
    assert (c.status, c.reason) == ("False", "EphemeralStorage")
    assert "lost with the pods" in c.message


def test_checkpoints_with_a_remote_tier_are_persistent_even_in_an_emptydir() -> None:
    s = compute_status(facts(checkpoint={"remote": "s3://ckpt/llama"}), job(), None, Observations(now=NOW))
    assert (s.checkpoint.ephemeral, s.checkpoint.remote) == (False, "s3://ckpt/llama")
    c = conditions_of(s)["CheckpointsPersistent"]
    assert (c.status, c.reason) == ("True", "RemoteTier")
    assert c.message == "checkpoints in /checkpoints in an emptyDir, each copied to s3://ckpt/llama"


def test_progress_is_of_the_maxsteps_the_running_trainer_trains_for_not_a_pending_edit() -> None:
    """A maxSteps lowered below the current step reaches the pods only when the job is re-rendered: until
    then the training goes on, and the status must not say 100%."""
    from fsdp_operator.controller.scraper import _completion

    exposition = (
        'fsdp_train_step{node_rank="0",local_rank="0"} 8\nfsdp_train_max_steps{node_rank="0",local_rank="0"} 20\n'
    )
    progress = parse_trainer_metrics(exposition)
    assert (progress.step, progress.max_steps) == (8, 20)
    rt, _client, body = fake_runtime(SCRAPED_MID_RUN, job(cond("Running")))
    lowered = {**body, "spec": {**body["spec"], "training": {**body["spec"]["training"], "maxSteps": 5}}}
    assert _completion(rt, lowered, progress)["progressPercentage"] == 40
    # A trainer that does not say (an older image, your own script) is measured by the spec, as before.
    assert _completion(rt, lowered, TrainerProgress(step=4))["progressPercentage"] == 80


def test_the_remote_tier_step_comes_from_rank_zero() -> None:
    p = parse_trainer_metrics(
        'fsdp_checkpoint_last_step{node_rank="0",local_rank="0"} 40\n'
        'fsdp_checkpoint_remote_last_step{node_rank="0",local_rank="0"} 30\n'
    )
    assert p.status_fields() == {"checkpoint": {"lastStep": 40, "lastUploadedStep": 30}}


def test_checkpoints_on_a_pvc_are_persistent() -> None:
    s = compute_status(facts(checkpoint={"claimName": "ckpt", "dir": "/data/ckpt"}), job(), None, Observations(now=NOW))
    assert (s.checkpoint.ephemeral, s.checkpoint.dir) == (False, "/data/ckpt")
    assert conditions_of(s)["CheckpointsPersistent"].status == "True"


def test_scraped_progress_is_carried_over() -> None:
    previous = {
        "phase": "Running",
        "step": 120,
        "loss": 2.5,
        "tokensPerSecond": 9000.0,
        "checkpoint": {"lastStep": 100},
        "trackerRuns": {"mlflow": "http://mlflow:5000/#/experiments/1/runs/abc"},
    }
    s = compute_status(facts(), job(cond("Running")), previous, Observations(now=NOW))
    assert (s.step, s.loss, s.tokens_per_second, s.checkpoint.last_step) == (120, 2.5, 9000.0, 100)
    assert s.tracker_runs == {"mlflow": "http://mlflow:5000/#/experiments/1/runs/abc"}
    # A finished training still links to its run.
    done = compute_status(facts(), job(cond("Succeeded")), previous, Observations(now=NOW))
    assert done.tracker_runs == previous["trackerRuns"]


def test_conditions_have_a_stable_order() -> None:
    j = job(cond("Succeeded"), cond("Running", "False"), cond("Created"))
    types = [c.type for c in compute_status(facts(), j, None, Observations(outcome=APPLIED, now=NOW)).conditions]
    assert types == ["Reconciled", "CheckpointsPersistent", "Created", "Running", "Succeeded"]


# --- final figures of a finished job --------------------------------------------------------

SCRAPED_MID_RUN = {
    "phase": "Running",
    "step": 6,
    "loss": 3.5,
    "tokensPerSecond": 800.0,
    "checkpoint": {"lastStep": 5},
    "progressPercentage": 60,
    "estimatedRemainingSeconds": 8,
    "remaining": "8s",
}


def test_succeeded_job_reports_max_steps_however_late_the_last_scrape() -> None:
    s = compute_status(facts(), job(cond("Succeeded")), SCRAPED_MID_RUN, Observations(now=NOW))  # maxSteps 10
    assert (s.phase, s.step, s.checkpoint.last_step) == ("Succeeded", 10, 10)
    # Loss and throughput cannot be derived: the last figures read stay.
    assert (s.loss, s.tokens_per_second) == (3.5, 800.0)
    assert (s.progress_percentage, s.estimated_remaining_seconds, s.remaining) == (100, 0, "0s")


def test_running_job_keeps_its_progress_and_time_left() -> None:
    s = compute_status(facts(), job(cond("Running")), SCRAPED_MID_RUN, Observations(now=NOW))
    assert (s.progress_percentage, s.estimated_remaining_seconds, s.remaining) == (60, 8, "8s")


@pytest.mark.parametrize("phase_condition", ["Failed", "Suspended", "Restarting"])
def test_a_job_that_is_not_running_keeps_its_progress_but_has_no_time_left(phase_condition: str) -> None:
    s = compute_status(facts(), job(cond("Running"), cond(phase_condition)), SCRAPED_MID_RUN, Observations(now=NOW))
    assert s.phase == phase_condition
    assert (s.progress_percentage, s.estimated_remaining_seconds, s.remaining) == (60, None, None)


def test_failed_job_keeps_the_last_scraped_step() -> None:
    s = compute_status(facts(), job(cond("Failed")), SCRAPED_MID_RUN, Observations(now=NOW))
    assert (s.phase, s.step, s.checkpoint.last_step) == ("Failed", 6, 5)


def test_succeeded_job_of_an_older_spec_is_not_called_complete() -> None:
    s = compute_status(
        facts(generation=2), job(cond("Succeeded"), generation=1), SCRAPED_MID_RUN, Observations(now=NOW)
    )
    assert (s.progress_percentage, s.estimated_remaining_seconds) == (60, None)


def test_succeeded_job_of_an_older_spec_keeps_the_scraped_step() -> None:
    # The job ran generation 1; the spec (maybe maxSteps) changed since and is not applied yet.
    s = compute_status(
        facts(generation=2), job(cond("Succeeded"), generation=1), SCRAPED_MID_RUN, Observations(now=NOW)
    )
    assert (s.step, s.checkpoint.last_step) == (6, 5)


# --- scheduling --------------------------------------------------------------------------

NO_FIT = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."


def job_pod(name: str, scheduled: str | None, reason: str = "", message: str = "", **meta: Any) -> dict[str, Any]:
    conditions = [] if scheduled is None else [
        {"type": "PodScheduled", "status": scheduled, "reason": reason, "message": message}
    ]  # fmt: skip
    return {"metadata": {"name": name, **meta}, "status": {"phase": "Pending", "conditions": conditions}}


def test_an_unschedulable_pod_explains_the_job() -> None:
    pods = [job_pod("llama-worker-1", "False", "Unschedulable", NO_FIT), job_pod("llama-worker-0", "True")]
    assert pod_scheduling(pods, expected=2) == Scheduling(
        False, "Unschedulable", f"1 of 2 pods cannot be scheduled: llama-worker-1: {NO_FIT}"
    )
    # Several: the first by name speaks for them.
    both = [job_pod(f"llama-worker-{i}", "False", "Unschedulable", f"{NO_FIT} ({i})") for i in (1, 0)]
    assert pod_scheduling(both, expected=2).message == f"2 of 2 pods cannot be scheduled: llama-worker-0: {NO_FIT} (0)"  # type: ignore[union-attr]
    lone = pod_scheduling([job_pod("x", "False", "SchedulingGated", "")], expected=1)
    assert lone == Scheduling(False, "SchedulingGated", "the pod cannot be scheduled: x: SchedulingGated")


def test_scheduled_needs_every_expected_pod_bound() -> None:
    bound = [job_pod("w0", "True"), job_pod("w1", "True")]
    assert pod_scheduling(bound, expected=2) == Scheduling(True, "Scheduled", "all 2 pods are scheduled")
    assert pod_scheduling(bound[:1], expected=2) is None  # the other pod is not created yet
    assert pod_scheduling([job_pod("w0", "True"), job_pod("w1", None)], expected=2) is None  # not tried yet
    assert pod_scheduling([], expected=2) is None
    # A pod on its way out does not count either way.
    gone = job_pod("w9", "False", "Unschedulable", NO_FIT, deletionTimestamp=NOW)
    assert pod_scheduling([*bound, gone], expected=2) == Scheduling(True, "Scheduled", "all 2 pods are scheduled")


# --- a configuration the trainer's check rejects ------------------------------------------

CHECK_LOG = (
    "Some weights of the model checkpoint were not used\n"
    "fsdp-train: invalid trainer configuration:\n"
    "  data.path: no .json, .jsonl, .parquet, .txt files in /data/*.jsonl\n"
    "  model.pretrained: /models/qwen has no config.json (expected a Hugging Face model directory)\n"
)
REJECTED = (
    "the trainer rejected its configuration in pod llama-worker-0: "
    "data.path: no .json, .jsonl, .parquet, .txt files in /data/*.jsonl; "
    "model.pretrained: /models/qwen has no config.json (expected a Hugging Face model directory)"
)


def trainer_pod(name: str, last: dict[str, Any] | None = None, state: dict[str, Any] | None = None) -> dict[str, Any]:
    pod = job_pod(name, "True")
    pod["status"]["containerStatuses"] = [
        {"name": "pytorch", "state": state or {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": last or {}}
    ]
    return pod


def test_the_checks_lines_from_a_crash_looping_pod_are_the_rejection() -> None:
    failed = {"terminated": {"exitCode": 2, "reason": "Error", "message": CHECK_LOG}}
    pods = [trainer_pod("llama-worker-1", last=failed), trainer_pod("llama-worker-0", last=failed)]
    assert config_rejection(pods) == REJECTED
    # The container ended there and has not restarted yet: the current state says it.
    assert config_rejection([trainer_pod("llama-worker-0", state=failed)]) == REJECTED
    # No termination message (a runtime without FallbackToLogsOnError): still named, with where to look.
    bare = {"terminated": {"exitCode": 2, "reason": "Error"}}
    assert config_rejection([trainer_pod("w0", last=bare)]) == (
        "the trainer rejected its configuration in pod w0: exit code 2; the pod's log says why"
    )


def test_other_failures_and_other_containers_are_not_a_rejection() -> None:
    crashed = {"terminated": {"exitCode": 1, "reason": "Error", "message": "Traceback ..."}}
    assert config_rejection([trainer_pod("w0", last=crashed)]) is None
    sidecar = trainer_pod("w0")
    sidecar["status"]["containerStatuses"][0]["name"] = "log-shipper"
    sidecar["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 2}}
    assert config_rejection([sidecar]) is None
    assert config_rejection([job_pod("w0", "True"), job_pod("w1", None)]) is None


def test_a_rejected_config_is_a_condition_and_the_message_until_the_spec_changes() -> None:
    running = compute_status(facts(), job(cond("Running")), None, Observations(rejection=REJECTED, now=NOW))
    config = conditions_of(running)["ConfigValid"]
    assert (config.status, config.reason, config.message) == ("False", "TrainerRejectedConfig", REJECTED)
    assert running.phase == "Running" and running.message == REJECTED
    events = transition_events(None, running)
    assert EventSpec("Warning", "TrainerRejectedConfig", REJECTED) in events
    # The backoff limit then fails the job; the reason stays the check's lines.
    stored = status_document(running)
    failed = compute_status(
        facts(), job(cond("Failed", message="backoff limit exceeded")), stored, Observations(now=LATER)
    )
    assert failed.phase == "Failed" and failed.message == REJECTED
    assert conditions_of(failed)["ConfigValid"].last_transition_time == NOW
    assert not [e for e in transition_events(stored, failed) if e.reason == "TrainerRejectedConfig"]
    # A new generation is a new config: the old verdict goes.
    fixed = compute_status(facts(generation=2), job(cond("Running"), generation=2), stored, Observations(now=LATER))
    assert "ConfigValid" not in conditions_of(fixed)
    assert fixed.message != REJECTED


# --- pods that cannot be created or started -----------------------------------------------

PULL = 'Back-off pulling image "registry.example.com/trainer:0.1": ErrImagePull: not found'


def started_pod(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return trainer_pod(name, state=state)


def test_a_container_the_kubelet_cannot_start_explains_the_job() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": PULL}}
    pods = [started_pod("llama-worker-1", waiting), started_pod("llama-worker-0", {"running": {}})]
    assert pod_start(pods, expected=2) == Start(
        False, "ImagePullBackOff", f"1 of 2 pods cannot start: llama-worker-1: container pytorch: {PULL}"
    )
    secret = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}
    assert pod_start([started_pod("w0", secret)], expected=1) == Start(
        False, "CreateContainerConfigError", 'the pod cannot start: w0: container pytorch: secret "hf-token" not found'
    )
    # Passing states are no failure: still creating, or the process's own crash loop (ConfigValid's business).
    for reason in ("ContainerCreating", "PodInitializing", "CrashLoopBackOff"):
        assert pod_start([started_pod("w0", {"waiting": {"reason": reason}})], expected=1) is None


def test_a_pod_the_api_server_refuses_is_the_reason_while_pods_are_missing() -> None:
    quota = 'Error creating: pods "llama-worker-0" is forbidden: exceeded quota: none, requested: pods=1'
    assert pod_start([], expected=2, create_failure=quota) == Start(
        False, "FailedCreatePod", f"the training operator cannot create the pods: {quota}"
    )
    # Once every pod exists, an old creation error says nothing.
    both = [started_pod("w0", {"running": {}}), started_pod("w1", {"running": {}})]
    assert pod_start(both, expected=2, create_failure=quota) == Start(
        True, "Started", "the trainer containers of all 2 pods have started"
    )
    assert pod_start(both[:1], expected=2) is None  # the other pod is not there yet
    # A container that ran and is waiting to restart has started.
    assert pod_start([trainer_pod("w0", last={"terminated": {"exitCode": 1}})], expected=1) == Start(
        True, "Started", "the trainer containers of all 1 pods have started"
    )


def test_pods_started_is_a_condition_the_message_and_one_event_per_reason() -> None:
    stuck = Start(False, "ImagePullBackOff", f"the pod cannot start: w0: container pytorch: {PULL}")
    s = compute_status(facts(), job(cond("Created")), None, Observations(outcome=APPLIED, start=stuck, now=NOW))
    c = conditions_of(s)["PodsStarted"]
    assert (c.status, c.reason, c.message) == ("False", "ImagePullBackOff", stuck.message)
    assert s.message == stuck.message
    assert EventSpec("Warning", "ImagePullBackOff", stuck.message) in transition_events(None, s)
    stored = status_document(s)
    # The next look says the same: kept, no new Event; no look (a job event): kept as well.
    again = compute_status(facts(), job(cond("Created")), stored, Observations(start=stuck, now=LATER))
    assert conditions_of(again)["PodsStarted"].last_transition_time == NOW
    assert not [e for e in transition_events(stored, again) if e.reason == "ImagePullBackOff"]
    assert (
        conditions_of(compute_status(facts(), job(cond("Created")), stored, Observations(now=LATER)))[
            "PodsStarted"
        ].status
        == "False"
    )
    # Fixed (the image exists now): True, and the message is the job's again.
    ok = Start(True, "Started", "the trainer containers of all 1 pods have started")
    fixed = compute_status(facts(), job(cond("Running")), stored, Observations(start=ok, now=LATER))
    assert conditions_of(fixed)["PodsStarted"].status == "True" and fixed.message != stuck.message
    # Suspended: no pods, no condition.
    assert "PodsStarted" not in conditions_of(
        compute_status(facts(), job(cond("Suspended")), stored, Observations(now=LATER))
    )


UNSCHEDULABLE = Scheduling(False, "Unschedulable", f"2 of 2 pods cannot be scheduled: llama-worker-0: {NO_FIT}")
SCHEDULED = Scheduling(True, "Scheduled", "all 2 pods are scheduled")


def test_unschedulable_pods_are_the_message_of_a_waiting_training() -> None:
    s = compute_status(
        facts(), job(cond("Created")), None, Observations(outcome=APPLIED, scheduling=UNSCHEDULABLE, now=NOW)
    )
    assert s.phase == "Created"
    assert s.message == UNSCHEDULABLE.message
    c = conditions_of(s)["Schedulable"]
    assert (c.status, c.reason, c.message, c.last_transition_time) == ("False", "Unschedulable", c.message, NOW)
    types = [c.type for c in s.conditions]
    assert types == ["Reconciled", "CheckpointsPersistent", "Schedulable", "Created"]
    # A job event (no pod information) keeps it, and the explanation.
    again = compute_status(facts(), job(cond("Created")), status_document(s), Observations(now=LATER))
    assert again.message == UNSCHEDULABLE.message
    assert conditions_of(again)["Schedulable"].model_dump() == c.model_dump()


def test_schedulable_clears_once_the_pods_are_placed() -> None:
    stuck = status_document(
        compute_status(facts(), job(cond("Created")), None, Observations(scheduling=UNSCHEDULABLE, now=NOW))
    )
    s = compute_status(facts(), job(cond("Created")), stuck, Observations(scheduling=SCHEDULED, now=LATER))
    c = conditions_of(s)["Schedulable"]
    assert (c.status, c.reason, c.last_transition_time) == ("True", "Scheduled", LATER)
    assert s.message == "PyTorchJob llama created; waiting for its pods"


def test_schedulable_after_the_job_ends_or_pauses() -> None:
    stuck = status_document(
        compute_status(facts(), job(cond("Created")), None, Observations(scheduling=UNSCHEDULABLE, now=NOW))
    )
    done = compute_status(facts(), job(cond("Succeeded", message="done")), stuck, Observations(now=LATER))
    assert (conditions_of(done)["Schedulable"].status, done.message) == ("True", "done")
    # Failing while unschedulable: that may well be why, so it stays.
    failed = compute_status(facts(), job(cond("Failed", message="deadline")), stuck, Observations(now=LATER))
    assert (conditions_of(failed)["Schedulable"].status, failed.message) == ("False", "deadline")
    # Suspended: no pods, nothing to schedule.
    assert "Schedulable" not in conditions_of(
        compute_status(facts(), job(suspend=True), stuck, Observations(now=LATER))
    )
    # Never looked at: no condition at all.
    assert "Schedulable" not in conditions_of(
        compute_status(facts(), job(cond("Running")), None, Observations(now=NOW))
    )


def test_unschedulable_is_a_warning_event_once() -> None:
    first = compute_status(facts(), job(cond("Created")), None, Observations(scheduling=UNSCHEDULABLE, now=NOW))
    assert EventSpec("Warning", "Unschedulable", UNSCHEDULABLE.message) in transition_events(None, first)
    later = compute_status(
        facts(), job(cond("Created")), status_document(first), Observations(scheduling=UNSCHEDULABLE, now=LATER)
    )
    assert [e.reason for e in transition_events(status_document(first), later)] == []


# --- patches ---------------------------------------------------------------------------


def test_status_patch_is_empty_when_nothing_changed() -> None:
    s = compute_status(facts(), job(cond("Running")), None, Observations(outcome=APPLIED, now=NOW))
    stored = status_document(s)
    again = compute_status(facts(), job(cond("Running")), stored, Observations(outcome=APPLIED, now=LATER))
    assert status_patch(stored, again) == {}


def test_status_patch_deletes_what_disappeared() -> None:
    before = job(
        cond("Running"), replicaStatuses={"Master": {"active": 1}, "Worker": {"active": 3}}, completionTime=NOW
    )
    after = job(cond("Running"), replicaStatuses={"Worker": {"active": 3}})
    stored = status_document(compute_status(facts(), before, None, Observations(now=NOW)))
    patch = status_patch(stored, compute_status(facts(), after, stored, Observations(now=NOW)))
    assert patch == {"replicaStatuses": {"Master": None}, "completionTime": None}


def test_status_patch_ignores_undeclared_fields() -> None:
    stored = status_document(compute_status(facts(), job(), None, Observations(now=NOW)))
    stored_with_junk = {**stored, "kopf": {"progress": {}}}
    assert status_patch(stored_with_junk, compute_status(facts(), job(), stored_with_junk, Observations(now=NOW))) == {}


def test_merge_patch_replaces_lists_and_recurses_into_maps() -> None:
    old = {"a": {"b": 1, "c": 2}, "l": [1, 2], "gone": True}
    new = {"a": {"b": 1, "c": 3}, "l": [1], "added": "x"}
    assert merge_patch(old, new) == {"a": {"c": 3}, "l": [1], "added": "x", "gone": None}
    assert merge_patch(new, copy.deepcopy(new)) == {}


def test_status_documents_validate_against_the_api_model() -> None:
    doc = status_document(
        compute_status(facts(), job(cond("Created"), cond("Running")), None, Observations(outcome=APPLIED, now=NOW))
    )
    assert FSDPTrainingStatus.model_validate(doc).phase == "Running"


# --- events ----------------------------------------------------------------------------


def reasons(previous: dict[str, Any] | None, new: FSDPTrainingStatus) -> list[str]:
    return [e.reason for e in transition_events(previous, new)]


def test_first_status_warns_about_ephemeral_checkpoints_once() -> None:
    first = compute_status(facts(), job(), None, Observations(outcome=APPLIED, now=NOW))
    events = transition_events(None, first)
    assert [(e.type, e.reason) for e in events] == [("Warning", "EphemeralCheckpoints")]
    assert (
        reasons(status_document(first), compute_status(facts(), job(), status_document(first), Observations(now=NOW)))
        == []
    )


def test_pvc_backed_training_gets_no_checkpoint_warning() -> None:
    s = compute_status(facts(checkpoint={"claimName": "c"}), job(), None, Observations(now=NOW))
    assert reasons(None, s) == []


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([cond("Created")], [cond("Created"), cond("Running")], ["Running"]),
        ([cond("Running")], [cond("Running", "False"), cond("Succeeded")], ["Succeeded"]),
        ([cond("Running")], [cond("Running", "False"), cond("Failed")], ["Failed"]),
        ([cond("Running")], [cond("Running", "False"), cond("Restarting")], ["Restarting"]),
        ([cond("Running")], [cond("Running")], []),
    ],
)
def test_phase_transitions_record_events(
    before: list[dict[str, Any]], after: list[dict[str, Any]], expected: list[str]
) -> None:
    prev = status_document(compute_status(facts(), job(*before), None, Observations(now=NOW)))
    assert reasons(prev, compute_status(facts(), job(*after), prev, Observations(now=NOW))) == expected


def test_failed_is_a_warning_event() -> None:
    prev = status_document(compute_status(facts(), job(cond("Running")), None, Observations(now=NOW)))
    (event,) = transition_events(
        prev, compute_status(facts(), job(cond("Failed", message="OOM")), prev, Observations(now=NOW))
    )
    assert (event.type, event.reason, event.message) == ("Warning", "Failed", "OOM")


def test_suspend_then_resume_records_both() -> None:
    running = status_document(compute_status(facts(), job(cond("Running")), None, Observations(now=NOW)))
    suspended = compute_status(facts(suspend=True), job(cond("Running"), suspend=True), running, Observations(now=NOW))
    assert reasons(running, suspended) == ["Suspended"]
    resumed = compute_status(facts(), job(cond("Running")), status_document(suspended), Observations(now=NOW))
    assert reasons(status_document(suspended), resumed) == ["Resumed", "Running"]


def test_reconcile_failure_is_a_warning_event_once_per_message() -> None:
    outcome = ReconcileOutcome(False, "ApplyFailed", "forbidden")
    first = compute_status(facts(), job(), None, Observations(outcome=outcome, now=NOW))
    assert ("Warning", "ApplyFailed") in [(e.type, e.reason) for e in transition_events(None, first)]
    again = compute_status(facts(), job(), status_document(first), Observations(outcome=outcome, now=NOW))
    assert "ApplyFailed" not in reasons(status_document(first), again)


# --- trainer progress --------------------------------------------------------------------

METRICS_TEXT = """\
# HELP fsdp_train_step Last completed optimizer step.
# TYPE fsdp_train_step gauge
fsdp_train_step{job_name="llama",node_rank="0",local_rank="1"} 41.0
fsdp_train_step{job_name="llama",node_rank="0",local_rank="0"} 42.0
# TYPE fsdp_train_loss gauge
fsdp_train_loss{job_name="llama",node_rank="0",local_rank="0"} 3.25
fsdp_train_loss{job_name="llama",node_rank="1",local_rank="0"} 9.0
# TYPE fsdp_train_global_tokens_per_second gauge
fsdp_train_global_tokens_per_second{job_name="llama",node_rank="0",local_rank="0"} 123456.789
# TYPE fsdp_checkpoint_last_step gauge
fsdp_checkpoint_last_step{job_name="llama",node_rank="0",local_rank="0"} 40.0
# TYPE fsdp_train_grad_norm gauge
fsdp_train_grad_norm{job_name="llama",node_rank="0",local_rank="0"} 1.5
# TYPE fsdp_train_step_duration_seconds histogram
fsdp_train_step_duration_seconds_bucket{job_name="llama",node_rank="0",local_rank="0",le="+Inf"} 42.0
fsdp_train_step_duration_seconds_count{job_name="llama",node_rank="0",local_rank="0"} 42.0
fsdp_train_step_duration_seconds_sum{job_name="llama",node_rank="0",local_rank="0"} 63.0
fsdp_train_step_duration_seconds_count{job_name="llama",node_rank="1",local_rank="0"} 42.0
fsdp_train_step_duration_seconds_sum{job_name="llama",node_rank="1",local_rank="0"} 420.0
"""


def test_trainer_metrics_are_read_from_rank_zero() -> None:
    p = parse_trainer_metrics(METRICS_TEXT)
    assert (p.step, p.loss, p.tokens_per_second, p.checkpoint_last_step) == (42, 3.25, 123456.789, 40)
    assert p.seconds_per_step == 1.5  # rank 0's histogram: 63 s over 42 steps (the stall check's fallback)
    assert p.status_fields() == {
        "step": 42,
        "loss": 3.25,
        "tokensPerSecond": 123456.8,
        "checkpoint": {"lastStep": 40},
    }


def test_the_tracker_runs_pages_come_from_their_info_series() -> None:
    page = "http://mlflow:5000/#/experiments/1/runs/abc"
    p = parse_trainer_metrics(
        "# TYPE fsdp_tracker_run_info gauge\n"
        f'fsdp_tracker_run_info{{local_rank="0",tracker="mlflow",url="{page}"}} 1\n'
        f'fsdp_tracker_run_info{{local_rank="0",tracker="other",url="http://x/{"y" * 2100}"}} 1\n'
        'fsdp_train_step{local_rank="0"} 3\n'
    )
    # An address longer than 2,048 characters stays out of the status.
    assert p.status_fields() == {"step": 3, "trackerRuns": {"mlflow": page}}


def test_the_status_names_a_mixture_of_experts_worst_router_layer() -> None:
    """Layer 3 left 5 of 8 experts without a token: collapsed, and worse than layer 0's uneven but full load."""

    def layer(n: int, load: float, unused: float, rank: str = "0") -> str:
        lb = f'node_rank="{rank}",local_rank="0",layer="{n}"'
        return f"fsdp_moe_expert_load_max_ratio{{{lb}}} {load}\nfsdp_moe_experts_unused_ratio{{{lb}}} {unused}\n"

    text = 'fsdp_train_step{node_rank="0",local_rank="0"} 9\n' + layer(0, 3.5, 0.0) + layer(3, 2.0, 0.625)
    # Another node's copy of the same layers does not count twice, nor override rank 0's.
    text += layer(3, 9.0, 0.0, rank="1")
    fields = parse_trainer_metrics(text).status_fields()
    assert fields["router"] == {"layer": "3", "maxLoadRatio": 2.0, "unusedExpertsRatio": 0.625, "collapsed": True}
    healthy = parse_trainer_metrics(layer(0, 1.25, 0.0) + layer(1, 1.5, 0.0)).status_fields()
    assert healthy["router"] == {"layer": "1", "maxLoadRatio": 1.5, "unusedExpertsRatio": 0.0, "collapsed": False}
    # A dense model has no router entry; the status carries the last one over, like the loss.
    assert "router" not in parse_trainer_metrics(METRICS_TEXT).status_fields()
    previous = {"phase": "Running", "step": 9, "router": fields["router"]}
    s = compute_status(facts(), job(cond("Running")), previous, Observations(now=NOW))
    assert s.router is not None and (s.router.layer, s.router.collapsed) == ("3", True)


def test_non_finite_and_missing_metrics_are_left_out() -> None:
    p = parse_trainer_metrics('fsdp_train_loss{local_rank="0"} NaN\nfsdp_train_step{local_rank="0"} 7\n')
    assert p.status_fields() == {"step": 7} and p.seconds_per_step is None
    assert parse_trainer_metrics("").status_fields() == {}


def pod(name: str, rtype: str, index: int, phase: str = "Running", ip: str | None = "10.0.0.1") -> dict[str, Any]:
    labels = {
        "training.kubeflow.org/job-name": "llama",
        "training.kubeflow.org/replica-type": rtype,
        "training.kubeflow.org/replica-index": str(index),
    }
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def test_rank0_pod_is_worker_zero_or_the_master() -> None:
    workers = [pod("w1", "worker", 1), pod("w0", "worker", 0)]
    assert rank0_pod(workers)["metadata"]["name"] == "w0"  # type: ignore[index]
    assert rank0_pod([*workers, pod("m0", "master", 0)])["metadata"]["name"] == "m0"  # type: ignore[index]
    # Not running, or no IP yet: nothing to scrape.
    assert rank0_pod([pod("w0", "worker", 0, phase="Pending"), pod("w1", "worker", 1, ip=None)]) is None
    # The last read after the job finished takes a completed pod that still has its IP.
    done = [pod("w0", "worker", 0, phase="Succeeded"), pod("w1", "worker", 1, phase="Succeeded", ip=None)]
    assert rank0_pod(done) is None
    assert rank0_pod(done, running_only=False)["metadata"]["name"] == "w0"  # type: ignore[index]
    # A pod being deleted (a stall restart) still answers with its old step: it is not the one to read.
    leaving = [{**pod("w0", "worker", 0), "metadata": {**pod("w0", "worker", 0)["metadata"], "deletionTimestamp": NOW}}]
    assert rank0_pod(leaving) is None
    assert rank0_pod(leaving, running_only=False)["metadata"]["name"] == "w0"  # type: ignore[index]


def _serve_metrics(ip: str, port: int, text: str) -> http.server.ThreadingHTTPServer:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((ip, port), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _node_metrics(node_rank: int, page: str | None = None) -> str:
    labels = f'job_name="t",node_rank="{node_rank}",local_rank="0"'
    text = f"# TYPE fsdp_train_step gauge\nfsdp_train_step{{{labels}}} 7\n"
    if page is not None:
        text += (
            f'# TYPE fsdp_tracker_run_info gauge\nfsdp_tracker_run_info{{{labels},tracker="mlflow",url="{page}"}} 1\n'
        )
    return text


def test_the_tracker_runs_are_read_from_the_pod_of_node_rank_0_whatever_its_index() -> None:
    """torchrun's c10d rendezvous numbers nodes by host name and pid: pod index 1 can hold node rank 0,
    and with it global rank 0, the only rank that exports the tracker runs' pages."""
    page = "http://mlflow:5000/#/experiments/1/runs/abc"
    first = _serve_metrics("127.0.0.1", 0, _node_metrics(1))
    port = first.server_address[1]
    try:
        second = _serve_metrics("127.0.0.2", port, _node_metrics(0, page))
    except OSError:
        first.shutdown()
        pytest.skip("127.0.0.2 is not served by this machine's loopback")

    async def read() -> TrainerProgress | None:
        async with aiohttp.ClientSession() as session:
            index0 = await scrape(session, "127.0.0.1", port)
            assert isinstance(index0, TrainerProgress)
            # What the index-0 pod serves names its node rank and has no page.
            assert (index0.node_rank, index0.tracker_runs) == (1, ())
            pods = [pod("t-worker-0", "worker", 0, ip="127.0.0.1"), pod("t-worker-1", "worker", 1, ip="127.0.0.2")]
            return await node_rank_0_progress(session, pods, port)

    try:
        found = asyncio.run(read())
    finally:
        for server in (first, second):
            server.shutdown()
            server.server_close()
    assert found is not None and found.node_rank == 0
    assert found.status_fields()["trackerRuns"] == {"mlflow": page}


# --- peering ---------------------------------------------------------------------------------


def peer(priority: int, seconds_ago: float = 1, lifetime: int = 60) -> dict[str, Any]:
    seen = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def test_peering_pauses_for_live_peers_of_higher_or_equal_priority() -> None:
    assert is_active({"me": peer(100), "other": peer(0)}, "me", 100) is True
    assert is_active({"me": peer(0), "deployed": peer(100)}, "me", 0) is False
    assert is_active({"me": peer(100), "twin": peer(100)}, "me", 100) is False  # kopf: both pause


def test_peering_ignores_dead_peers() -> None:
    assert is_active({"me": peer(0), "gone": peer(100, seconds_ago=120)}, "me", 0) is True
    assert is_active(None, "me", 0) is True


# --- which copy of the status and of the job is the fresher ------------------------------------


def runtime() -> Runtime:
    return Runtime(client=KubeClient(lambda: None), metrics=OperatorMetrics())  # type: ignore[arg-type,return-value]


def with_rv(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def test_own_status_write_wins_until_the_watch_catches_up() -> None:
    rt = runtime()
    body = {**training(), "status": {"phase": "Pending"}}
    rt.wrote_status("u-1", {"metadata": {"resourceVersion": "10"}}, {"phase": "Running"})
    assert rt.previous_status(with_rv(body, 9))["phase"] == "Running"  # the watch lags our write
    # The watch delivered our write or something later (maybe another writer's): trust it.
    assert rt.previous_status(with_rv(body, 10))["phase"] == "Pending"
    assert rt.previous_status(with_rv(body, 11))["phase"] == "Pending"


def test_newest_job_compares_resource_versions() -> None:
    applied, watched = with_rv(job(cond("Created")), 5), with_rv(job(cond("Running")), 7)
    assert newest_job(applied, watched) is watched
    assert newest_job(watched, applied) is watched
    assert newest_job(None, watched) is watched
    assert newest_job(applied, None) is applied


# --- the writers the pod loop and the job watch use (fake API server) ---------------------------


class FakeClient:
    """Answers status patches like the API server: merges them and bumps the resourceVersion."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = copy.deepcopy(status)
        self.patches: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.lists = {}
        self.listed = []
        self.rv = 100

    async def create(self, obj: dict[str, Any]) -> Any:
        self.created.append(copy.deepcopy(obj))
        return obj

    lists: dict[str, list[dict[str, Any]]]
    listed: list[tuple[str, str | None, str | None]]

    async def list(
        self, api_version: str, kind: str, ns: str | None, label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        self.listed.append((kind, label_selector, field_selector))
        return copy.deepcopy(self.lists.get(kind, []))

    async def patch_status(self, api_version: str, kind: str, ns: str, name: str, patch: dict[str, Any]) -> Any:
        self.patches.append(copy.deepcopy(patch))
        self.status = _merge(self.status, patch)
        self.rv += 1
        return {"metadata": {"resourceVersion": str(self.rv)}, "status": copy.deepcopy(self.status)}


def _merge(old: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def fake_runtime(status: dict[str, Any], job_body: dict[str, Any] | None) -> tuple[Runtime, FakeClient, dict]:
    client = FakeClient(status)
    rt = Runtime(client=client, metrics=OperatorMetrics())  # type: ignore[arg-type]
    body = with_rv({**training(resources={"nodes": 2}), "status": status}, 1)
    rt.remember(body)
    if job_body is not None:
        rt.jobs["u-1"] = job_body
    return rt, client, rt.trainings[("ml", "llama")]


FINISHED = {**SCRAPED_MID_RUN, "phase": "Succeeded", "step": 10, "checkpoint": {"lastStep": 10}}


def test_final_read_of_a_succeeded_job_takes_figures_of_its_last_step_only() -> None:
    rt, client, body = fake_runtime(FINISHED, None)
    last = {"step": 10, "loss": 2.25, "tokensPerSecond": 900.0, "checkpoint": {"lastStep": 10}}
    assert asyncio.run(record_progress(rt, body, last, final=True)) is True
    assert client.patches == [{"loss": 2.25, "tokensPerSecond": 900.0}]
    # An earlier step's figures (say, a pod from before a restart) are not the final ones.
    stale = {"step": 7, "loss": 9.0, "tokensPerSecond": 1.0}
    assert asyncio.run(record_progress(rt, body, stale, final=True)) is False
    assert len(client.patches) == 1


def test_final_read_of_a_failed_job_takes_what_the_trainer_said_last() -> None:
    rt, client, body = fake_runtime({**SCRAPED_MID_RUN, "phase": "Failed"}, None)
    assert asyncio.run(record_progress(rt, body, {"step": 8, "loss": 4.0}, final=True)) is True
    assert client.patches == [{"step": 8, "loss": 4.0}]


def test_periodic_scrape_never_overwrites_a_finished_job() -> None:
    rt, client, body = fake_runtime(FINISHED, None)
    assert asyncio.run(record_progress(rt, body, {"step": 9, "loss": 2.5})) is False
    assert client.patches == []
    running, client, body = fake_runtime(SCRAPED_MID_RUN, None)
    assert asyncio.run(record_progress(running, body, {"step": 7, "loss": 3.0})) is True
    assert client.patches == [{"step": 7, "loss": 3.0}]


def test_scheduling_is_written_into_the_status_from_the_last_job_seen() -> None:
    created = status_document(
        compute_status(facts(resources={"nodes": 2}), job(cond("Created")), None, Observations(now=NOW))
    )
    rt, client, body = fake_runtime(created, job(cond("Created")))
    assert asyncio.run(record_pods(rt, body, PodsReport(UNSCHEDULABLE))) is True
    (patch,) = client.patches
    assert patch["message"] == UNSCHEDULABLE.message
    assert client.status["phase"] == "Created"
    sched = [c for c in client.status["conditions"] if c["type"] == "Schedulable"]
    assert [(c["status"], c["reason"]) for c in sched] == [("False", "Unschedulable")]
    # Posted by the loop itself (kopf's Event queue exists only inside its handlers).
    (event,) = client.created
    assert (event["kind"], event["type"], event["reason"], event["message"]) == (
        "Event",
        "Warning",
        "Unschedulable",
        UNSCHEDULABLE.message,
    )
    assert event["involvedObject"] == {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "name": "llama",
        "namespace": "ml",
        "uid": "u-1",
    }
    assert event["metadata"] == {"namespace": "ml", "generateName": "fsdp-operator-"}
    # Same answer next tick: nothing to write.
    assert asyncio.run(record_pods(rt, body, PodsReport(UNSCHEDULABLE))) is False
    assert len(client.patches) == 1
    # Without the job (watch not caught up yet) nothing is written.
    rt.jobs.clear()
    assert asyncio.run(record_pods(rt, body, PodsReport(SCHEDULED))) is False
    assert len(client.patches) == 1


def test_pod_loop_checks_only_trainings_whose_pods_may_be_waiting() -> None:
    def waiting(phase: str, job_body: dict[str, Any] | None, **status: Any) -> bool:
        rt, _, _ = fake_runtime({"phase": phase, **status}, job_body)
        return len(waiting_trainings(rt)) == 1

    assert waiting("Created", job(cond("Created")))
    assert waiting("Restarting", job(cond("Restarting")))
    assert not waiting("Created", None)  # the job watch has not delivered it yet
    # Kubeflow calls a worker-only job Running once one worker runs: check until all do.
    assert waiting("Running", job(cond("Running"), replicaStatuses={"Worker": {"active": 1}}))
    assert not waiting("Running", job(cond("Running"), replicaStatuses={"Worker": {"active": 2}}), step=1)
    stuck = [{"type": "Schedulable", "status": "False", "reason": "Unschedulable", "lastTransitionTime": NOW}]
    assert waiting("Running", job(cond("Running"), replicaStatuses={"Worker": {"active": 2}}), step=1, conditions=stuck)
    for done in ("Succeeded", "Failed", "Suspended"):
        assert not waiting(done, job(cond(done)))
    # All pods active but no step yet: the trainer may be failing its config check in a restart loop.
    all_active = job(cond("Running"), replicaStatuses={"Worker": {"active": 2}})
    assert not waiting("Running", all_active, step=3)
    assert waiting("Running", all_active)


def test_without_a_job_a_failed_apply_is_the_status_message() -> None:
    outcome = ReconcileOutcome(False, "ForeignObject", "refusing to take over ConfigMap x-trainer (no owner)")
    s = compute_status(facts(), None, None, Observations(outcome=outcome, now=NOW))
    assert (s.phase, s.message) == ("Pending", "refusing to take over ConfigMap x-trainer (no owner)")
    assert conditions_of(s)["Reconciled"].reason == "ForeignObject"


def test_messages_from_outside_are_bounded() -> None:
    huge = "x" * 50_000
    s = compute_status(facts(), None, None, Observations(outcome=ReconcileOutcome(False, "ApplyFailed", huge), now=NOW))
    assert len(s.message) == MAX_MESSAGE and s.message.endswith("...")
    assert len(conditions_of(s)["Reconciled"].message) == MAX_MESSAGE


def test_failing_applies_back_off_instead_of_retrying_every_two_seconds() -> None:
    assert [retry_delay(r, 2) for r in range(6)] == [2, 4, 8, 16, 32, 64]
    assert retry_delay(50, 2) == retry_delay(10_000, 30) == MAX_RETRY_DELAY


def test_the_scrape_does_not_follow_redirects() -> None:
    """A trainer port that answers with a redirect gets nothing fetched elsewhere."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            if self.path == "/metrics":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere")
                self.end_headers()
            else:
                body = METRICS_TEXT.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def read() -> TrainerProgress | Unreadable:
        async with aiohttp.ClientSession() as session:
            return await scrape(session, "127.0.0.1", server.server_address[1])

    try:
        found = asyncio.run(read())
        assert isinstance(found, Unreadable) and found.reason.endswith("/metrics answered HTTP 302"), found
        assert hits == ["/metrics"]
    finally:
        server.shutdown()


def test_the_pod_loop_reads_the_training_operators_refusal_while_pods_are_missing() -> None:
    created = job(cond("Created"))
    created["metadata"]["uid"] = "job-uid"
    # What the job watch keeps of the job must include its uid (the Events' selector).
    rt, client, _ = fake_runtime({"phase": "Created"}, trim_job(created))
    refusal = 'Error creating: pods "llama-worker-0" is forbidden: exceeded quota: no-pods'
    client.lists["Event"] = [
        {"message": "Error creating: an older refusal", "lastTimestamp": NOW},
        {"message": refusal, "lastTimestamp": LATER},
    ]
    assert asyncio.run(check_pods_once(rt, None)) == 1
    assert client.listed == [
        ("Pod", "training.kubeflow.org/job-name=llama", None),
        ("Event", None, "involvedObject.uid=job-uid,reason=FailedCreatePod"),
    ]
    started = {c["type"]: c for c in client.status["conditions"]}["PodsStarted"]
    assert (started["status"], started["reason"]) == ("False", "FailedCreatePod")
    assert started["message"] == f"the training operator cannot create the pods: {refusal}"
    # With every pod there, the Events are not read.
    client.lists["Pod"] = [trainer_pod("llama-worker-0"), trainer_pod("llama-worker-1")]
    client.listed.clear()
    asyncio.run(check_pods_once(rt, None))
    assert [kind for kind, _, _ in client.listed] == ["Pod"]


def test_the_stall_check_writes_only_when_the_condition_changes() -> None:
    """It runs on every scrape of every running training: steady progress must not patch the status each time."""
    rt, client, body = fake_runtime(SCRAPED_MID_RUN, job(cond("Running")))
    stall = {"minSeconds": 30, "startupSeconds": 600, "checkpointSeconds": 0}
    body = {**body, "spec": {**body["spec"], "stall": stall, "checkpoint": {"intervalSteps": 1000}}}

    def tick(step: int | None, now: float) -> None:
        asyncio.run(check_stall(rt, body, TrainerProgress(step=step), now))

    for i, step in enumerate(range(1, 30)):  # a step every 2 s
        tick(step, 100.0 + 2 * i)
    assert len(client.patches) == 1, client.patches  # Stalled=False once, not once per step
    conds = {c["type"]: c for c in client.status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("False", "Progressing")
    for now in (200.0, 205.0, 210.0):  # step 29 seen at 156 s: stalled past 186 s
        tick(29, now)
    assert len(client.patches) == 2, client.patches  # turned True once
    conds = {c["type"]: c for c in client.status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("True", "NoProgress")
    assert conds["Stalled"]["message"] == "no new step since step 29 for 44 s (limit 30 s)"


def test_an_endpoint_that_cannot_be_read_is_never_a_stall_and_restarts_nothing() -> None:
    """Cannot see is not stuck (issue 24, 9): before, an unreadable endpoint counted as a trainer starting up,
    and onStall: restart deleted healthy pods after startupSeconds (a namespace the operator may not scrape)."""
    rt, client, body = fake_runtime(SCRAPED_MID_RUN, job(cond("Running")))
    stall = {"onStall": "restart", "minSeconds": 30, "startupSeconds": 60, "checkpointSeconds": 0}
    body = {**body, "spec": {**body["spec"], "stall": stall, "checkpoint": {"intervalSteps": 1000}}}
    client.lists["Pod"] = [trainer_pod("llama-worker-0"), trainer_pod("llama-worker-1")]
    deleted: list[str] = []

    async def delete(api_version: str, kind: str, ns: str, name: str, uid: str = "") -> None:
        deleted.append(name)

    client.delete = delete  # type: ignore[attr-defined]
    why = "http://10.0.0.5:9090/metrics did not answer within 5 s"
    for now in (100.0, 130.0, 170.0, 700.0):
        asyncio.run(check_stall(rt, body, Unreadable(why), now))
    assert deleted == []
    # Written once, when the limit passed at 170 s (the condition is written when it changes).
    conds = {c["type"]: c for c in client.status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("Unknown", "MetricsUnreachable")
    assert conds["Stalled"]["message"] == (
        "no new step seen since the start (no step reported yet) for 70 s (limit 60 s), but the trainer's "
        f"metrics cannot be read ({why}): not called stalled, nothing restarted"
    )
    # Readable again and still no step: that is a stall, and the pods are restarted.
    asyncio.run(check_stall(rt, body, TrainerProgress(step=None), 701.0))
    assert sorted(deleted) == ["llama-worker-0", "llama-worker-1"]
    conds = {c["type"]: c for c in client.status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("True", "NoProgress")
