"""The operator against a real API server, with exactly the RBAC of the bundle.

kustomize/overlays/clusterwide (CRDs, RBAC, all but the Deployment; built
with the test cluster's ``kubectl kustomize``; cluster-wide because every test
uses a namespace of its own) is installed in a namespace of its own, and
the operator runs as a child process with the Deployment's command line and
the ServiceAccount's token as its only credentials (``fsdp_localcluster.
operator_install``). There is no training operator: tests write PyTorchJob
status by hand, as it would.

The tests share one operator (module scope); each uses its own namespace and
sets up what it reads (fixtures), so any subset runs in any order.
"""

from __future__ import annotations

import http.server
import json
import re
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api import FSDPTraining, FSDPTrainingStatus
from fsdp_api.ports import free_port
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import REPO_ROOT
from fsdp_localcluster.control_plane import CONTROLLER_MANAGER, ControlPlane
from fsdp_localcluster.operator_install import (
    FSDPTRAININGS,
    OPERATOR_SERVICE_ACCOUNT,
    OperatorInstall,
    OperatorProcess,
    can_i,
    install_operator,
    kustomize,
)
from fsdp_localcluster.prometheus import PrometheusServer
from fsdp_localcluster.wait import wait_for
from fsdp_operator.controller.node_exclusion import CLUSTER_CAP_ENV, MAX_EXCLUDE_SECONDS_ENV, WORKLOAD_EVIDENCE_ENV
from fsdp_operator.controller.nodes.xids import PROMETHEUS_URL_ENV, XID_WINDOW_ENV
from fsdp_operator.render import render

from tests.support.dcgm import StandInExporter

pytestmark = pytest.mark.cluster

OPERATOR_NS = "fsdp-operator-e2e"
SERVICE_ACCOUNT = OPERATOR_SERVICE_ACCOUNT
PEERING = "fsdp-operator"
KOPF_PREFIXES = ("kopf.zalando.org", "kopf.dev")
JOB_TIMEOUT = 30.0
POLL = 0.1  # seconds between checks: the operator answers within tens of milliseconds
# kopf's APIForbiddenError or an HTTP 403 in a line. A 403 right after a comma or dot is the milliseconds of a log
# timestamp ("09:16:12,403"), which once failed CI; a lower-case "is forbidden" is an admission policy's refusal
# that a test plants, not RBAC.
_PERMISSION_ERROR = re.compile(r"Forbidden|(?<![,.\d])403(?!\d)")


def permission_errors(log: str) -> list[str]:
    """The operator log's lines that report an RBAC refusal."""
    return [line for line in log.splitlines() if _PERMISSION_ERROR.search(line)]


def test_permission_errors_are_told_from_timestamps() -> None:
    timestamped = "[2026-11-28 09:16:12,403] fsdp_operator.contro [INFO    ] fsdp-operator starting"
    assert permission_errors(timestamped) == []
    refusals = [
        "kopf.objects [ERROR] APIForbiddenError: ('pytorchjobs is forbidden', {'code': 403})",
        "aiohttp.ClientResponseError: 403, message='Forbidden'",
        "status 403 from the API server",
    ]
    planted = 'ApplyFailed: pytorchjobs.kubeflow.org "retry" is forbidden: ValidatingAdmissionPolicy denied request'
    assert permission_errors(planted) == []
    assert permission_errors("\n".join([timestamped, *refusals])) == refusals


@dataclass
class Env:
    cluster: TestCluster
    install: OperatorInstall
    operator: OperatorProcess
    kubeconfig: Path
    workdir: Path
    # The stand-in dcgm-exporter the env's Prometheus scrapes, and which the operator asks for new XIDs.
    dcgm: StandInExporter
    prometheus: PrometheusServer
    # Operator log ranges (offsets) to skip when looking for permission errors.
    restart_windows: list[tuple[int, int]] = field(default_factory=list)

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json", "--show-managed-fields"] + (["-n", namespace] if namespace else [])
        res = self.cluster.kubectl(*args, check=False)
        if res.returncode != 0:
            assert "NotFound" in res.stderr, res.stderr
            return None
        return dict(json.loads(res.stdout))

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
        return list(json.loads(self.cluster.kubectl(*args).stdout)["items"])

    def apply_training(self, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
        self.cluster.create_namespace(namespace)
        body = training(name, namespace, **spec)
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
        return body

    def patch_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "patch", "fsdptraining", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec})
        )

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "patch",
            "pytorchjob",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )

    def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": status}),
        )  # fmt: skip

    def wait_job(self, namespace: str, name: str, timeout: float = JOB_TIMEOUT) -> dict[str, Any]:
        return dict(
            wait_for(lambda: self.get("pytorchjob", namespace, name), timeout, what=f"PyTorchJob {name}", interval=POLL)
        )

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return dict((self.get("fsdptraining", namespace, name) or {}).get("status") or {})

    def wait_status(self, namespace: str, name: str, what: str, timeout: float = JOB_TIMEOUT, **expected: Any) -> dict:
        def check() -> dict[str, Any] | None:
            s = self.status(namespace, name)
            assert all(s.get(k) == v for k, v in expected.items()), f"status is {s}"
            return s

        return dict(wait_for(check, timeout, what=what, interval=POLL))

    def event_reasons(self, namespace: str, name: str) -> list[str]:
        res = self.cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
        )
        return [e["reason"] for e in json.loads(res.stdout)["items"] if e["involvedObject"]["kind"] == "FSDPTraining"]

    def wait_events(self, namespace: str, name: str, *reasons: str) -> list[str]:
        def check() -> list[str] | None:
            got = self.event_reasons(namespace, name)
            missing = [r for r in reasons if r not in got]
            assert not missing, f"events so far: {got}"
            return got

        return list(wait_for(check, JOB_TIMEOUT, what=f"events {reasons} on {name}", interval=POLL))


def training(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
        "model": {"preset": "tiny"},
        "training": {"maxSteps": 50, "seqLen": 128},
        "resources": {"nodes": 2, "gpusPerNode": 0, "nodePool": "default"},
    }
    return {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**base, **spec},
    }


def worker_pod(namespace: str, job: str, node: str | None = None) -> dict[str, Any]:
    """Worker 0 of PyTorchJob ``job``, as the training operator creates it (bound to ``node`` if given)."""
    spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": "ghcr.io/fsdp-k8s/trainer:0.1.0"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-worker-0",
            "namespace": namespace,
            "labels": {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "0",
            },
        },
        "spec": spec,
    }


@pytest.fixture(scope="module")
def env(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("operator-e2e")
    install = install_operator(cluster, OPERATOR_NS, deploy=False, clusterwide=True)
    assert install.kubeconfig is not None
    # A real Prometheus scraping a stand-in dcgm-exporter: the operator asks it for new XIDs, over
    # a 20 s window (a test cannot wait the default 10 minutes).
    dcgm = StandInExporter({})
    prom = PrometheusServer([dcgm.target], job="dcgm-exporter").start()
    xids = {PROMETHEUS_URL_ENV: prom.url, XID_WINDOW_ENV: "20"}
    # One excluded node at a time in the whole cluster, for at most 30 minutes: the caps the
    # exclusion tests read (the training's own evidence only alerts: the default).
    xids |= {CLUSTER_CAP_ENV: "1", MAX_EXCLUDE_SECONDS_ENV: "1800"}
    # pod_name: a stable peer identity across restarts, as in a pod.
    op = install.process(
        workdir / "operator.log", priority=100, scrape_interval=0.5, pod_name="fsdp-operator-e2e-0", env=xids
    )
    op.start()
    e = Env(cluster, install, op, install.kubeconfig, workdir, dcgm, prom)
    try:
        yield e
    finally:
        op.stop()
        prom.stop()
        dcgm.close()
        print(f"\n----- operator log (tail) -----\n{op.log_tail(60)}")


# --- identity ---------------------------------------------------------------------------


def test_operator_runs_with_only_its_service_account(env: Env) -> None:
    c = env.cluster
    who = json.loads(c.kubectl("auth", "whoami", "-o", "json", kubeconfig=env.kubeconfig).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{OPERATOR_NS}:{SERVICE_ACCOUNT}"
    assert env.operator.alive()

    def can(*args: str) -> str:
        return can_i(c, env.kubeconfig, *args)

    # What the operator does, and a few things it must not be able to do.
    assert can("patch", "pytorchjobs.kubeflow.org", "-A") == "yes"
    assert can("patch", FSDPTRAININGS, "--subresource=status", "-A") == "yes"
    assert can("get", "secrets", "-A") == "no"
    assert can("delete", "pytorchjobs.kubeflow.org", "-A") == "no"
    assert can("update", FSDPTRAININGS, "-A") == "no"
    assert can("list", "customresourcedefinitions") == "no"


# --- create -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def created(env: Env) -> tuple[str, str]:
    """A new training the operator has handled: its job, status and events written."""
    ns, name = "e2e-create", "llama"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    env.wait_status(ns, name, "status of a new training", phase="Created", observedGeneration=1)
    env.wait_events(ns, name, "JobCreated", "EphemeralCheckpoints")
    return ns, name


def test_create_applies_the_rendered_objects_owned_by_the_training(env: Env, created: tuple[str, str]) -> None:
    ns, name = created
    job = env.wait_job(ns, name)
    body = env.get("fsdptraining", ns, name)
    assert body is not None
    expected = {o["kind"]: o for o in render(FSDPTraining.model_validate(body), set_owner=True)}
    assert set(expected) == {"ConfigMap", "PyTorchJob", "PodMonitor", "NetworkPolicy"}
    owner = [
        {
            "apiVersion": "training.fsdp.dev/v1alpha1",
            "kind": "FSDPTraining",
            "name": name,
            "uid": body["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    config_map = env.get("configmap", ns, expected["ConfigMap"]["metadata"]["name"])
    monitor = env.get("podmonitor", ns, expected["PodMonitor"]["metadata"]["name"])
    policy = env.get("networkpolicy", ns, expected["NetworkPolicy"]["metadata"]["name"])
    assert config_map is not None and monitor is not None and policy is not None
    for obj, want in (
        (job, expected["PyTorchJob"]),
        (config_map, expected["ConfigMap"]),
        (monitor, expected["PodMonitor"]),
        (policy, expected["NetworkPolicy"]),
    ):
        assert obj["metadata"]["ownerReferences"] == owner
        assert want["metadata"]["labels"].items() <= obj["metadata"]["labels"].items()
        assert obj["metadata"]["annotations"]["training.fsdp.dev/generation"] == "1"
        # Server-side apply by the operator's field manager, nobody else's.
        assert {m["manager"] for m in obj["metadata"]["managedFields"]} == {"fsdp-operator"}
    assert job["spec"] == expected["PyTorchJob"]["spec"]
    assert config_map["data"] == expected["ConfigMap"]["data"]
    assert monitor["spec"] == expected["PodMonitor"]["spec"]
    assert policy["spec"] == expected["NetworkPolicy"]["spec"]

    status = env.wait_status(ns, name, "status of a new training", phase="Created", observedGeneration=1)
    assert (status["jobName"], status["nodes"], status["gpus"]) == (name, 2, 0)
    assert status["checkpoint"] == {"dir": "/checkpoints", "ephemeral": True}
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Reconciled"]["status"], conds["Reconciled"]["reason"]) == ("True", "Applied")
    assert (conds["CheckpointsPersistent"]["status"], conds["CheckpointsPersistent"]["reason"]) == (
        "False",
        "EphemeralStorage",
    )
    env.wait_events(ns, name, "JobCreated", "EphemeralCheckpoints")


def test_kopf_state_is_stored_under_our_api_group(env: Env, created: tuple[str, str]) -> None:
    ns, name = created
    body = env.get("fsdptraining", ns, name)
    assert body is not None
    annotations = body["metadata"].get("annotations") or {}
    assert "training.fsdp.dev/last-handled-configuration" in annotations
    stored = json.loads(annotations["training.fsdp.dev/last-handled-configuration"])
    assert stored["spec"]["model"] == {"preset": "tiny"}
    leaked = [k for k in annotations if k.startswith(KOPF_PREFIXES)]
    assert leaked == []
    # Deletion relies on ownerReferences and garbage collection: no finalizer at all.
    assert body["metadata"].get("finalizers") in (None, [])
    assert not any(str(k).startswith("kopf") for k in body.get("status", {}))


# --- status -----------------------------------------------------------------------------

STARTED, FINISHED = "2026-03-01T10:00:00Z", "2026-03-01T12:30:00Z"


def running_job_status(name: str) -> dict[str, Any]:
    """A PyTorchJob's status once both workers run, as the training operator writes it."""
    return {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "lastTransitionTime": STARTED},
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "lastTransitionTime": STARTED},
        ],
        "startTime": STARTED,
        "replicaStatuses": {"Worker": {"active": 2, "selector": f"training.kubeflow.org/job-name={name}"}},
    }


def succeeded_job_status(name: str) -> dict[str, Any]:
    """The same job's status once it completed (merged into the running one: startTime stays)."""
    return {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "lastTransitionTime": STARTED},
            {"type": "Running", "status": "False", "reason": "PyTorchJobSucceeded", "lastTransitionTime": FINISHED},
            {
                "type": "Succeeded",
                "status": "True",
                "reason": "PyTorchJobSucceeded",
                "message": f"PyTorchJob {name} is successfully completed.",
                "lastTransitionTime": FINISHED,
            },
        ],
        "completionTime": FINISHED,
        "replicaStatuses": {"Worker": {"active": 0, "succeeded": 2}},
    }


FAILED_JOB_STATUS = {
    "conditions": [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
        {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": "Worker 1 OOMKilled"},
    ]
}


@pytest.fixture(scope="module")
def succeeded(env: Env) -> tuple[str, str]:
    """A training whose job ran and succeeded."""
    ns, name = "e2e-finished", "run"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    env.patch_job_status(ns, name, running_job_status(name))
    env.wait_status(ns, name, "phase Running", phase="Running", startTime=STARTED)
    env.patch_job_status(ns, name, succeeded_job_status(name))
    env.wait_status(ns, name, "phase Succeeded", phase="Succeeded", completionTime=FINISHED)
    return ns, name


@pytest.fixture(scope="module")
def failed(env: Env) -> tuple[str, str]:
    """A training whose job failed."""
    ns, name = "e2e-finished", "crash"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    env.patch_job_status(ns, name, FAILED_JOB_STATUS)
    env.wait_status(ns, name, "phase Failed", phase="Failed")
    return ns, name


def test_status_follows_the_pytorchjob(env: Env) -> None:
    ns, name = "e2e-status", "run"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    started, finished = STARTED, FINISHED
    env.patch_job_status(ns, name, running_job_status(name))
    s = env.wait_status(ns, name, "phase Running", phase="Running", startTime=started)
    assert s["replicaStatuses"] == {"Worker": {"active": 2, "succeeded": 0, "failed": 0}}
    running = next(c for c in s["conditions"] if c["type"] == "Running")
    assert running == {
        "type": "Running",
        "status": "True",
        "reason": "PyTorchJobRunning",
        "message": "",
        "observedGeneration": 1,
        "lastTransitionTime": started,
    }

    env.patch_job_status(ns, name, succeeded_job_status(name))
    s = env.wait_status(ns, name, "phase Succeeded", phase="Succeeded", completionTime=finished)
    assert s["message"] == "PyTorchJob run is successfully completed."
    assert s["replicaStatuses"]["Worker"] == {"active": 0, "succeeded": 2, "failed": 0}
    env.wait_events(ns, name, "JobCreated", "Running", "Succeeded")


def test_written_status_survives_schema_pruning(env: Env, succeeded: tuple[str, str]) -> None:
    """Every field the operator writes is declared in the CRD, so what it wrote is what is stored."""
    s = env.status(*succeeded)
    model = FSDPTrainingStatus.model_validate(s)  # extra="forbid": nothing unexpected either
    for key in ("phase", "message", "observedGeneration", "conditions", "jobName", "nodes", "gpus"):
        assert key in s, key
    for key in ("replicaStatuses", "startTime", "completionTime", "checkpoint"):
        assert key in s, key
    assert all("observedGeneration" in c for c in s["conditions"])
    assert s["checkpoint"]["ephemeral"] is True
    assert model.phase == "Succeeded"


def test_failed_job_is_a_failed_training_with_a_warning(env: Env) -> None:
    ns, name = "e2e-status", "crash"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    env.patch_job_status(ns, name, FAILED_JOB_STATUS)
    s = env.wait_status(ns, name, "phase Failed", phase="Failed")
    assert s["message"] == "Worker 1 OOMKilled"
    env.wait_events(ns, name, "Failed")
    res = env.cluster.kubectl("get", "events", "-n", ns, "--field-selector", "reason=Failed", "-o", "json")
    assert {e["type"] for e in json.loads(res.stdout)["items"]} == {"Warning"}


# --- suspend / resume ---------------------------------------------------------------------


def test_suspend_and_resume(env: Env) -> None:
    ns, name = "e2e-suspend", "pause"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    env.patch_job_status(
        ns, name, {"conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}]}
    )
    env.wait_status(ns, name, "phase Running", phase="Running")

    env.patch_spec(ns, name, {"suspend": True})
    wait_for(
        lambda: (env.get("pytorchjob", ns, name) or {})["spec"]["runPolicy"].get("suspend") is True,
        JOB_TIMEOUT,
        what="runPolicy.suspend true",
        interval=POLL,
    )
    s = env.wait_status(ns, name, "phase Suspended", phase="Suspended", observedGeneration=2)
    suspended = next(c for c in s["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["observedGeneration"]) == ("True", 2)
    env.wait_events(ns, name, "Suspended")

    env.patch_spec(ns, name, {"suspend": False})
    wait_for(
        lambda: (env.get("pytorchjob", ns, name) or {})["spec"]["runPolicy"].get("suspend") is False,
        JOB_TIMEOUT,
        what="runPolicy.suspend false",
        interval=POLL,
    )
    env.wait_status(ns, name, "phase Running again", phase="Running", observedGeneration=3)
    env.wait_events(ns, name, "Suspended", "Resumed")


# --- spec changes and drift --------------------------------------------------------------------


def test_the_memory_plan_is_in_the_status(env: Env) -> None:
    ns = "e2e-memory"
    one_a10g = {"nodes": 1, "gpusPerNode": 1, "nodePool": "default", "instanceTypes": ["g5.xlarge"]}
    env.apply_training(ns, "fits", resources=one_a10g)
    env.apply_training(ns, "too-big", model={"preset": "llama3.1-8b"}, resources=one_a10g)

    def fits_memory(name: str) -> dict[str, Any] | None:
        status = (env.get("fsdptraining", ns, name) or {}).get("status") or {}
        found = {c["type"]: c for c in status.get("conditions", [])}.get("FitsMemory")
        return {**found, "memory": status.get("memory")} if found else None

    ok = wait_for(lambda: fits_memory("fits"), JOB_TIMEOUT, what="FitsMemory", interval=POLL)
    assert (ok["status"], ok["reason"]) == ("True", "Fits"), ok
    assert ok["message"].startswith("fits: about ") and "of g5.xlarge (NVIDIA A10G)" in ok["message"]
    assert ok["memory"]["instanceType"] == "g5.xlarge" and ok["memory"]["gpuMemoryBytes"] == 24 << 30
    bad = wait_for(lambda: fits_memory("too-big"), JOB_TIMEOUT, what="FitsMemory", interval=POLL)
    assert (bad["status"], bad["reason"]) == ("False", "DoesNotFit"), bad
    assert bad["memory"]["estimatedBytesPerGpu"] > bad["memory"]["gpuMemoryBytes"]
    assert bad["message"].startswith("does not fit: about ")

    def does_not_fit() -> list[str] | None:
        events = json.loads(env.cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        return [e["involvedObject"]["name"] for e in events if e["reason"] == "DoesNotFit"] or None

    # The Event is posted after the status is written (a loaded CI machine showed it a moment later).
    assert wait_for(does_not_fit, JOB_TIMEOUT, what="the DoesNotFit Event", interval=POLL) == ["too-big"]


def test_disabling_metrics_removes_the_podmonitor(env: Env) -> None:
    ns, name = "e2e-update", "quiet"
    env.apply_training(ns, name)
    wait_for(lambda: env.get("podmonitor", ns, name), JOB_TIMEOUT, what="the PodMonitor", interval=POLL)
    env.patch_spec(ns, name, {"metrics": {"enabled": False}})
    wait_for(
        lambda: env.get("podmonitor", ns, name) is None, JOB_TIMEOUT, what="the PodMonitor to be deleted", interval=POLL
    )
    cm = env.items("configmap", ns, "training.fsdp.dev/job=quiet")
    assert len(cm) == 1
    assert "enabled: false" in cm[0]["data"]["train.yaml"]


def test_disabling_the_network_policy_deletes_it(env: Env) -> None:
    ns, name = "e2e-update", "open"
    env.apply_training(ns, name)
    wait_for(lambda: env.get("networkpolicy", ns, name), JOB_TIMEOUT, what="the NetworkPolicy", interval=POLL)
    # The label the policy selects namespaces by is the API server's own.
    assert env.get("namespace", None, ns)["metadata"]["labels"]["kubernetes.io/metadata.name"] == ns
    env.patch_spec(ns, name, {"networkPolicy": {"enabled": False}})
    wait_for(
        lambda: env.get("networkpolicy", ns, name) is None,
        JOB_TIMEOUT,
        what="the NetworkPolicy to be deleted",
        interval=POLL,
    )
    assert env.get("podmonitor", ns, name) is not None


def test_a_deleted_job_is_recreated(env: Env) -> None:
    ns, name = "e2e-update", "heal"
    env.apply_training(ns, name)
    old = env.wait_job(ns, name)
    env.cluster.kubectl("delete", "pytorchjob", name, "-n", ns, "--wait=false")
    new = wait_for(
        lambda: (j := env.get("pytorchjob", ns, name)) and j["metadata"]["uid"] != old["metadata"]["uid"] and j,
        JOB_TIMEOUT,
        what="the PyTorchJob to be re-created",
        interval=POLL,
    )
    assert new["spec"] == old["spec"]


def _run_to_success(env: Env, ns: str, name: str) -> None:
    """A training whose job (no training operator here: the test writes its status) runs, then succeeds."""
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    env.patch_job_status(ns, name, running_job_status(name))
    env.wait_status(ns, name, "phase Running", phase="Running")
    env.patch_job_status(ns, name, succeeded_job_status(name))
    env.wait_status(ns, name, "phase Succeeded", phase="Succeeded")


def test_a_finished_trainings_deleted_job_is_not_recreated(env: Env) -> None:
    """Re-creating the job of a Succeeded training would train it again (from step 0 without a PVC)."""
    ns, name = "e2e-done-delete", "done"
    _run_to_success(env, ns, name)
    env.cluster.kubectl("delete", "pytorchjob", name, "-n", ns)
    env.wait_events(ns, name, "JobDeleted")
    # The operator answers within tens of milliseconds: 3 s without a job is a decision.
    time.sleep(3)
    assert env.get("pytorchjob", ns, name) is None
    assert env.status(ns, name)["phase"] == "Succeeded"


def test_an_operator_restart_never_reruns_a_finished_training_whose_job_is_gone(env: Env) -> None:
    """The job of a Succeeded training removed while the operator was down stays gone (issue 24, 2).

    Before the fix the resume handler applied every training: the job came back and the phase went
    from Succeeded to Created, training the run again.
    """
    ns, name = "e2e-done-restart", "done"
    _run_to_success(env, ns, name)
    env.operator.stop()
    try:
        env.cluster.kubectl("delete", "pytorchjob", name, "-n", ns)
    finally:
        env.operator.start()
    said = f"{ns}/{name} is Succeeded: nothing re-applied on resume"
    wait_for(
        lambda: said in env.operator.log() or env.get("pytorchjob", ns, name) is not None,
        60,
        what="the resume handler to pass the training (or re-create its job)",
        interval=POLL,
    )
    time.sleep(3)  # the operator answers within tens of milliseconds: 3 s without a job is a decision
    assert env.get("pytorchjob", ns, name) is None
    assert env.status(ns, name)["phase"] == "Succeeded"


def _block_job_creation(env: Env, namespace: str) -> None:
    """A ValidatingAdmissionPolicy that makes the API server refuse new PyTorchJobs in ``namespace``."""
    name = f"block-pytorchjobs-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["kubeflow.org"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pytorchjobs"],
                    }
                ]
            },
            "validations": [{"expression": "false", "message": "blocked by the test", "reason": "Invalid"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    env.cluster.apply({"apiVersion": "v1", "kind": "List", "items": [policy, binding]})
    probe = json.dumps(render(FSDPTraining.model_validate(training("probe", namespace)))[1])

    def refused() -> bool:
        res = env.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=probe, check=False)
        return res.returncode != 0 and "blocked by the test" in res.stderr

    # The policy is compiled in the background: wait until the API server enforces it.
    wait_for(refused, JOB_TIMEOUT, what="the admission policy to refuse PyTorchJobs", interval=POLL)


def test_a_failed_recreate_is_retried_until_the_job_exists(env: Env) -> None:
    ns, name = "e2e-recreate", "retry"
    env.apply_training(ns, name)
    old = env.wait_job(ns, name)
    _block_job_creation(env, ns)
    env.cluster.kubectl("delete", "pytorchjob", name, "-n", ns)

    def recreate_failing() -> dict[str, Any] | None:
        conds = {c["type"]: c for c in env.status(ns, name).get("conditions") or []}
        rec = conds.get("Reconciled") or {}
        return rec if rec.get("reason") == "JobRecreateFailed" and "attempt 2" in rec.get("message", "") else None

    # Two failed attempts, each said in the status with its retry.
    rec = wait_for(recreate_failing, JOB_TIMEOUT, what="two failed re-create attempts in the status", interval=POLL)
    assert rec["status"] == "False" and "blocked by the test" in rec["message"] and "retrying in" in rec["message"]
    assert env.get("pytorchjob", ns, name) is None
    env.cluster.kubectl("delete", "validatingadmissionpolicybinding", f"block-pytorchjobs-{ns}")
    env.cluster.kubectl("delete", "validatingadmissionpolicy", f"block-pytorchjobs-{ns}")
    new = wait_for(
        lambda: (j := env.get("pytorchjob", ns, name)) and j["metadata"]["uid"] != old["metadata"]["uid"] and j,
        60,
        what="the PyTorchJob to be re-created once the API server allows it",
        interval=POLL,
    )
    assert new["spec"] == old["spec"]
    env.wait_status(ns, name, "Reconciled again", phase="Created")


def test_a_foreign_object_of_the_same_name_is_never_taken_over(env: Env) -> None:
    ns, name = "e2e-foreign", "tidy"
    env.cluster.create_namespace(ns)
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-trainer", "namespace": ns},
        "data": {"keep": "me"},
    }
    env.cluster.kubectl("create", "-f", "-", input=json.dumps(theirs))
    env.apply_training(ns, name)

    def refused() -> dict[str, Any] | None:
        s = env.status(ns, name)
        rec = {c["type"]: c for c in s.get("conditions") or []}.get("Reconciled") or {}
        return s if rec.get("reason") == "ForeignObject" else None

    status = wait_for(refused, JOB_TIMEOUT, what="the training to refuse the foreign ConfigMap", interval=POLL)
    assert status["phase"] == "Pending"
    assert f"ConfigMap {name}-trainer (no owner)" in status["message"], status["message"]
    cm = env.get("configmap", ns, f"{name}-trainer")
    assert cm is not None and cm["data"] == {"keep": "me"}
    assert not cm["metadata"].get("ownerReferences")
    assert "fsdp-operator" not in {m["manager"] for m in cm["metadata"]["managedFields"]}
    # Nothing of the training was applied, the job included.
    assert env.get("pytorchjob", ns, name) is None
    assert env.get("podmonitor", ns, name) is None
    # Once the name is free, the next attempt (5 s, then backing off) applies everything.
    env.cluster.kubectl("delete", "configmap", f"{name}-trainer", "-n", ns)
    env.wait_job(ns, name, timeout=60)
    mine = env.get("configmap", ns, f"{name}-trainer")
    assert mine is not None and mine["metadata"]["ownerReferences"][0]["name"] == name


# --- progress from the trainer's metrics -----------------------------------------------------

TRAINER_METRICS = """\
# TYPE fsdp_train_step gauge
fsdp_train_step{{job_name="prog",node_rank="0",local_rank="0"}} {step}
# TYPE fsdp_train_loss gauge
fsdp_train_loss{{job_name="prog",node_rank="0",local_rank="0"}} {loss}
# TYPE fsdp_train_global_tokens_per_second gauge
fsdp_train_global_tokens_per_second{{job_name="prog",node_rank="0",local_rank="0"}} 5120.5
# TYPE fsdp_checkpoint_last_step gauge
fsdp_checkpoint_last_step{{job_name="prog",node_rank="0",local_rank="0"}} 10
# TYPE fsdp_train_step_duration_seconds histogram
fsdp_train_step_duration_seconds_bucket{{job_name="prog",node_rank="0",local_rank="0",le="+Inf"}} 20
fsdp_train_step_duration_seconds_sum{{job_name="prog",node_rank="0",local_rank="0"}} 40.0
fsdp_train_step_duration_seconds_count{{job_name="prog",node_rank="0",local_rank="0"}} 20
# TYPE fsdp_tracker_run_info gauge
fsdp_tracker_run_info{{job_name="prog",node_rank="0",local_rank="0",tracker="mlflow",url="{run}"}} 1
# TYPE fsdp_moe_expert_load_max_ratio gauge
fsdp_moe_expert_load_max_ratio{{job_name="prog",node_rank="0",local_rank="0",layer="1"}} 1.75
# TYPE fsdp_moe_experts_unused_ratio gauge
fsdp_moe_experts_unused_ratio{{job_name="prog",node_rank="0",local_rank="0",layer="1"}} 0.0
"""
RUN_PAGE = "http://mlflow.mlflow.svc:5000/#/experiments/3/runs/9f2c41d0a6b84c3e8e1f0b7a5d2c6e11"


class _FakeTrainer(http.server.BaseHTTPRequestHandler):
    step = 20
    loss = 2.75

    def do_GET(self) -> None:
        body = TRAINER_METRICS.format(step=type(self).step, loss=type(self).loss, run=RUN_PAGE).encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_step_loss_and_throughput_come_from_the_rank0_pod(env: Env) -> None:
    ns, name = "e2e-progress", "prog"
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _FakeTrainer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env.apply_training(ns, name, metrics={"enabled": True, "port": port})
        env.wait_job(ns, name)
        # What the training operator and the kubelet would create: worker 0, running, on loopback.
        pod = worker_pod(ns, name)
        env.cluster.apply(pod)
        env.patch_pod_status(
            ns, pod["metadata"]["name"], {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
        )
        env.patch_job_status(ns, name, {"conditions": [{"type": "Running", "status": "True", "reason": "Running"}]})
        s = env.wait_status(ns, name, "scraped progress", step=20, loss=2.75, tokensPerSecond=5120.5)
        assert s["checkpoint"]["lastStep"] == 10
        assert s["phase"] == "Running"
        # maxSteps 50: 40 % done; 30 steps left at the trainer's mean 2 s (its histogram: 40 s / 20 steps).
        assert (s["progressPercentage"], s["estimatedRemainingSeconds"], s["remaining"]) == (40, 60, "1m00s"), s
        assert s["trackerRuns"] == {"mlflow": RUN_PAGE}
        # A mixture of experts' worst router layer, through the API server's status schema.
        assert s["router"] == {"layer": "1", "maxLoadRatio": 1.75, "unusedExpertsRatio": 0.0, "collapsed": False}

        _FakeTrainer.step = 21
        env.wait_status(ns, name, "the next step", step=21, progressPercentage=42)
        row = env.cluster.kubectl("get", "fsdptraining", name, "-n", ns, "--no-headers").stdout.split()
        # NAME PHASE NODES GPUS STEP LOSS DONE% REMAINING: the time left now from the operator's own step clock.
        assert row[:7] == [name, "Running", "2", "0", "21", "2.75", "42"], row
        assert re.fullmatch(r"\d+(s|m(\d\ds)?)", row[7]), row

        # The job finishes. The pod is done (the periodic scrape skips it), its endpoint
        # still answers with the last step's figures, which only the final read can see.
        env.patch_pod_status(ns, pod["metadata"]["name"], {"phase": "Succeeded"})
        time.sleep(1.5)  # three scrape intervals: a scrape that listed the pod as Running is over
        _FakeTrainer.step, _FakeTrainer.loss = 50, 1.5  # maxSteps is 50
        env.patch_job_status(ns, name, {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]})
        s = env.wait_status(ns, name, "the final figures", phase="Succeeded", step=50, loss=1.5)
        assert s["checkpoint"]["lastStep"] == 50  # the trainer always checkpoints its last step
        assert (s["progressPercentage"], s["estimatedRemainingSeconds"], s["remaining"]) == (100, 0, "0s"), s
    finally:
        server.shutdown()
        server.server_close()


# --- pods the scheduler cannot place ------------------------------------------------------------

NO_FIT = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."


def test_unschedulable_pods_are_explained_in_the_status(env: Env) -> None:
    ns, name = "e2e-unschedulable", "nofit"
    env.apply_training(ns, name, resources={"nodes": 1, "gpusPerNode": 0, "nodePool": "default"})
    env.wait_job(ns, name)
    env.wait_status(ns, name, "phase Created", phase="Created")
    # What the training operator creates and the scheduler then marks, as they would.
    pod_name = f"{name}-worker-0"
    env.cluster.apply(worker_pod(ns, name))
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_FIT}
    env.patch_pod_status(ns, pod_name, {"phase": "Pending", "conditions": [unschedulable]})

    explained = f"the pod cannot be scheduled: {pod_name}: {NO_FIT}"
    s = env.wait_status(ns, name, "the scheduler's reason", phase="Created", message=explained)
    cond = next(c for c in s["conditions"] if c["type"] == "Schedulable")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", explained)
    env.wait_events(ns, name, "Unschedulable")

    # A node turns up and the pod is bound: the explanation goes.
    env.patch_pod_status(ns, pod_name, {"conditions": [{"type": "PodScheduled", "status": "True"}]})
    s = env.wait_status(
        ns, name, "the pod scheduled", phase="Created", message=f"PyTorchJob {name} created; waiting for its pods"
    )
    cond = next(c for c in s["conditions"] if c["type"] == "Schedulable")
    assert (cond["status"], cond["reason"]) == ("True", "Scheduled")


# --- nodes that report a problem -----------------------------------------------------------------


def test_a_node_whose_own_conditions_report_a_problem_is_named_in_the_status(env: Env) -> None:
    """The EKS node monitoring agent's AcceleratedHardwareReady=False on the node of a running pod."""
    ns, name = "e2e-nodes", "badnode"
    node = "ip-10-0-7-21.ec2.internal"
    env.apply_training(ns, name, resources={"nodes": 1, "gpusPerNode": 0, "nodePool": "default"})
    env.wait_job(ns, name)

    def node_conditions(*conditions: dict[str, str]) -> None:
        env.cluster.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]}}),
        )  # fmt: skip

    env.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        xid = "GPU 0000:53:00.0 has fallen off the bus"
        node_conditions(
            {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error", "message": xid},
            {"type": "NetworkingReady", "status": "True", "reason": "NetworkingIsReady"},
        )
        pod_name = f"{name}-worker-0"
        env.cluster.apply(worker_pod(ns, name, node=node))
        env.patch_pod_status(ns, pod_name, {"phase": "Running"})
        env.patch_job_status(ns, name, {"conditions": [{"type": "Running", "status": "True", "reason": "Running"}]})

        suspect = f"node {node} (pods {pod_name}): AcceleratedHardwareReady=False (NvidiaXID79Error: {xid})"
        s = env.wait_status(ns, name, "the suspect node in the status", phase="Running", message=suspect)
        cond = next(c for c in s["conditions"] if c["type"] == "NodesHealthy")
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "SuspectNode", suspect)
        env.wait_events(ns, name, "SuspectNode")

        # The node is repaired (or its problem clears): the condition says so and the message goes.
        node_conditions({"type": "AcceleratedHardwareReady", "status": "True", "reason": "AcceleratedHardwareIsReady"})

        def healthy() -> dict[str, Any] | None:
            s = env.status(ns, name)
            cond = next((c for c in s.get("conditions") or [] if c["type"] == "NodesHealthy"), {})
            return s if cond.get("status") == "True" else None

        s = wait_for(healthy, JOB_TIMEOUT, what="NodesHealthy True again", interval=POLL)
        cond = next(c for c in s["conditions"] if c["type"] == "NodesHealthy")
        assert (cond["reason"], cond["message"]) == (
            "NoSuspectNode",
            "no node condition reports a problem and no GPU reported a new XID on the 1 node(s) of the training's pods",
        )
        assert s["message"] != suspect
    finally:
        env.cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")


def test_a_new_gpu_xid_from_dcgm_exporter_names_the_node_and_an_old_one_does_not(env: Env) -> None:
    """The operator asks a real Prometheus, which scrapes a stand-in dcgm-exporter, for XIDs that changed."""
    ns, name = "e2e-xid", "xid"
    node = "ip-10-0-7-23.ec2.internal"
    env.dcgm.codes[node, 3] = 43  # left by an earlier, killed CUDA process: old news
    # The old value must be in the operator's window before it changes, or there is no change to see:
    # run alone, this test starts right after Prometheus, whose first scrapes may not have happened yet.
    old = f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}} == 43'
    env.prometheus.wait_for_series(f"count_over_time(({old})[20s:2s])")
    env.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        env.apply_training(ns, name, resources={"nodes": 1, "gpusPerNode": 0, "nodePool": "default"})
        env.wait_job(ns, name)
        env.cluster.apply(worker_pod(ns, name, node=node))
        env.patch_pod_status(ns, f"{name}-worker-0", {"phase": "Running"})
        env.patch_job_status(ns, name, {"conditions": [{"type": "Running", "status": "True", "reason": "Running"}]})

        def nodes_healthy() -> dict[str, Any] | None:
            found = [c for c in env.status(ns, name).get("conditions") or [] if c["type"] == "NodesHealthy"]
            return found[0] if found else None

        healthy = wait_for(nodes_healthy, JOB_TIMEOUT, what="NodesHealthy", interval=POLL)
        assert (healthy["status"], healthy["message"]) == (
            "True",
            "no node condition reports a problem and no GPU reported a new XID on the 1 node(s) of the training's pods",
        )
        env.dcgm.codes[node, 3] = 79
        suspect = f"node {node} (pods {name}-worker-0): new GPU XID 79 on GPU 3 (dcgm-exporter, last 20 s)"
        s = env.wait_status(ns, name, "the new XID in the status", phase="Running", message=suspect)
        cond = next(c for c in s["conditions"] if c["type"] == "NodesHealthy")
        assert (cond["status"], cond["reason"]) == ("False", "SuspectNode")
        env.wait_events(ns, name, "SuspectNode")
    finally:
        env.dcgm.codes.pop((node, 3), None)
        env.cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")


def test_a_node_where_the_trainer_keeps_failing_is_a_suspect(env: Env) -> None:
    """Two failures of the trainer container on one node across restarts: counted in the status, then the verdict."""
    ns, name = "e2e-incidents", "incidents"
    node = "ip-10-0-7-24.ec2.internal"
    env.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})

    def crashed(*finished: str) -> dict[str, Any]:
        ends = [{"terminated": {"exitCode": 139, "reason": "Error", "finishedAt": t}} for t in finished]
        last = ends[0] if ends else {}
        state = {"name": "pytorch", "restartCount": len(ends), "ready": True, "image": "x", "imageID": ""}
        return {"phase": "Running", "containerStatuses": [state | {"state": {"running": {}}, "lastState": last}]}

    try:
        env.apply_training(ns, name, resources={"nodes": 1, "gpusPerNode": 0, "nodePool": "default"})
        env.wait_job(ns, name)
        env.cluster.apply(worker_pod(ns, name, node=node))
        env.patch_pod_status(ns, f"{name}-worker-0", crashed("2026-11-29T03:50:00Z"))
        env.patch_job_status(ns, name, {"conditions": [{"type": "Running", "status": "True", "reason": "Running"}]})

        def counted(failures: int) -> dict[str, Any] | None:
            s = env.status(ns, name)
            found = [i for i in s.get("nodeIncidents") or [] if i["node"] == node]
            return s if found and found[0]["failures"] == failures else None

        s = wait_for(lambda: counted(1), JOB_TIMEOUT, what="the first failure counted", interval=POLL)
        assert s["nodeIncidents"] == [
            {
                "node": node,
                "failures": 1,
                "stalls": 0,
                "lastFailureAt": "2026-11-29T03:50:00Z",
                "last": f"the trainer container of pod {name}-worker-0 exited 139 (Error) at 2026-11-29T03:50:00Z",
                "time": s["nodeIncidents"][0]["time"],
            }
        ]
        cond = next(c for c in s["conditions"] if c["type"] == "NodesHealthy")
        assert cond["status"] == "True"  # once is any node's luck
        # The container fails again in place (restartPolicy OnFailure): the second one makes the node a suspect.
        env.patch_pod_status(ns, f"{name}-worker-0", crashed("2026-11-29T03:58:00Z"))
        suspect = (
            f"node {node} (pods {name}-worker-0): 2 trainer failure(s) across restarts (the last: the trainer "
            f"container of pod {name}-worker-0 exited 139 (Error) at 2026-11-29T03:58:00Z)"
        )
        s = env.wait_status(ns, name, "the repeated failures in the status", phase="Running", message=suspect)
        assert (s["nodeIncidents"][0]["failures"], s["nodeIncidents"][0]["lastFailureAt"]) == (
            2,
            "2026-11-29T03:58:00Z",
        )
        cond = next(c for c in s["conditions"] if c["type"] == "NodesHealthy")
        assert (cond["status"], cond["reason"]) == ("False", "SuspectNode")
        env.wait_events(ns, name, "SuspectNode")
        time.sleep(3.5)  # one more node check (every 3 s here): the same termination is never counted twice
        assert env.status(ns, name)["nodeIncidents"][0]["failures"] == 2
    finally:
        env.cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")


def _node_excluder_binding(env: Env, name: str) -> None:
    binding = yaml.safe_load((REPO_ROOT / "kustomize/components/node-exclusion/cluster_role_binding.yaml").read_text())
    binding["metadata"]["name"] = name
    binding["subjects"][0]["namespace"] = OPERATOR_NS
    env.cluster.apply(binding)


def _excluding_training_on(env: Env, ns: str, name: str, node: str, **health: Any) -> None:
    """A one-node training with onSuspectNode exclude, its worker pod Running on ``node``, its job Running."""
    env.apply_training(
        ns,
        name,
        resources={"nodes": 1, "gpusPerNode": 0, "nodePool": "default"},
        checkpoint={"claimName": "ckpt"},
        health={"onSuspectNode": "exclude", **health},
    )
    env.wait_job(ns, name)
    env.cluster.apply(worker_pod(ns, name, node=node))
    env.patch_pod_status(ns, f"{name}-worker-0", {"phase": "Running"})
    env.patch_job_status(ns, name, {"conditions": [{"type": "Running", "status": "True", "reason": "Running"}]})


def _nodes_healthy(status: dict[str, Any]) -> dict[str, Any]:
    """The status's NodesHealthy condition ({} before the first node check)."""
    return next((c for c in status.get("conditions") or [] if c["type"] == "NodesHealthy"), {})


def test_a_suspect_node_is_excluded_its_pods_restarted_and_the_taint_lifted_when_due(env: Env) -> None:
    """onSuspectNode exclude: the node tainted (its other taints kept), the pods deleted, the status and an Event."""
    ns, name = "e2e-exclude", "exclude"
    node = "ip-10-0-7-22.ec2.internal"
    _node_excluder_binding(env, "e2e-node-excluder")
    gpu_taint = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    env.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "spec": {"taints": [gpu_taint]}})
    try:
        xid = {
            "type": "AcceleratedHardwareReady",
            "status": "False",
            "reason": "NvidiaXID79Error",
            "message": "off the bus",
        }
        env.cluster.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}, xid]}}),
        )  # fmt: skip
        _excluding_training_on(env, ns, name, node, excludeSeconds=3600)
        before = time.time()
        env.wait_events(ns, name, "NodeExcluded")

        # The pod was deleted (no kubelet here to finish it, nor a controller to re-create it), the node tainted.
        def deleted() -> bool:
            return all(p["metadata"].get("deletionTimestamp") for p in env.items("pods", ns))

        assert wait_for(deleted, JOB_TIMEOUT, what="the pod deleted", interval=POLL)
        tainted = env.get("node", None, node)
        assert tainted is not None
        # The node lifecycle controller's own taints (not-ready: no kubelet here) are kept too.
        ours = {"key": "training.fsdp.dev/excluded", "value": "suspect", "effect": "NoSchedule"}
        assert gpu_taint in tainted["spec"]["taints"] and ours in tainted["spec"]["taints"]
        assert tainted["metadata"]["labels"]["training.fsdp.dev/excluded"] == "true"
        notes = tainted["metadata"]["annotations"]
        reason = "AcceleratedHardwareReady=False (NvidiaXID79Error: off the bus)"
        assert notes["training.fsdp.dev/excluded-by"] == f"{ns}/{name}: {reason}"
        until = datetime.fromisoformat(notes["training.fsdp.dev/excluded-until"].replace("Z", "+00:00")).timestamp()
        # The training asked for an hour; the operator's admin allows half of it.
        assert before + 1800 - 60 < until < time.time() + 1800 + 1
        status = env.status(ns, name)
        assert [(e["node"], e["reason"], e["until"]) for e in status["excludedNodes"]] == [
            (node, reason, notes["training.fsdp.dev/excluded-until"])
        ]
        health = next(c for c in status["conditions"] if c["type"] == "NodesHealthy")
        assert health["message"] == (
            f"node {node} (pods {name}-worker-0): {reason}; excluded {node} and restarted the pods elsewhere"
        )

        # The operator counts it for the dashboard's "Excluded nodes" panel.
        with urllib.request.urlopen(f"http://127.0.0.1:{env.operator.metrics_port}/metrics", timeout=5) as rsp:
            text = rsp.read().decode()
        assert f'fsdp_operator_node_exclusions_total{{job_name="{name}",namespace="{ns}"}} 1.0' in text

        # Its time is up: the next node check lifts the taint and our marks; the other taints stay.
        env.cluster.kubectl(
            "annotate", "node", node, "--overwrite", "training.fsdp.dev/excluded-until=2020-01-01T00:00:00Z"
        )

        def lifted() -> dict[str, Any] | None:
            got = env.get("node", None, node) or {}
            taints = (got.get("spec") or {}).get("taints") or []
            return got if gpu_taint in taints and not any(t["key"] == ours["key"] for t in taints) else None

        after = wait_for(lifted, JOB_TIMEOUT, what="the exclusion lifted", interval=POLL)
        assert "training.fsdp.dev/excluded" not in after["metadata"].get("labels", {})
        assert not any(k.startswith("training.fsdp.dev/") for k in after["metadata"].get("annotations", {}))
    finally:
        env.cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")
        env.cluster.kubectl("delete", "clusterrolebinding", "e2e-node-excluder", "--ignore-not-found")


def test_a_node_is_not_excluded_on_the_trainings_own_evidence_unless_the_admin_allows_it(env: Env) -> None:
    """Repeated failures of a training's own container make its node a suspect, named but never tainted by default."""
    ns, name = "e2e-own-evidence", "own"
    node = "ip-10-0-7-41.ec2.internal"
    _node_excluder_binding(env, "e2e-node-excluder-own")
    env.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        _excluding_training_on(env, ns, name, node)
        for restarts in (1, 2):  # two failures on one node: a suspect (incidents.py)
            state = {"name": "pytorch", "restartCount": restarts, "ready": True, "image": "x", "imageID": ""}
            finished = f"2026-11-29T03:5{restarts}:00Z"
            last = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": finished}}
            env.patch_pod_status(
                ns,
                f"{name}-worker-0",
                {"phase": "Running", "containerStatuses": [state | {"state": {"running": {}}, "lastState": last}]},
            )
            wait_for(
                lambda n=restarts: any(i["failures"] == n for i in env.status(ns, name).get("nodeIncidents") or []),
                JOB_TIMEOUT,
                what=f"failure {restarts} counted",
                interval=POLL,
            )
        held = (
            f"not excluded: {node} only on the training's own evidence (its ranks' lateness or its containers' "
            f"failures); the operator excludes on it with {WORKLOAD_EVIDENCE_ENV}=true (docs/operator.md)"
        )

        def named_not_excluded() -> dict[str, Any] | None:
            cond = _nodes_healthy(env.status(ns, name))
            return cond if cond.get("reason") == "SuspectNode" and held in cond.get("message", "") else None

        wait_for(named_not_excluded, JOB_TIMEOUT, what="the suspect named and held", interval=POLL)
        got = env.get("node", None, node) or {}
        assert not any(t["key"] == "training.fsdp.dev/excluded" for t in (got.get("spec") or {}).get("taints") or [])
        assert not env.status(ns, name).get("excludedNodes")

    finally:
        env.cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")
        env.cluster.kubectl("delete", "clusterrolebinding", "e2e-node-excluder-own", "--ignore-not-found")


def test_the_cluster_cap_holds_across_trainings_judged_in_the_same_node_check(env: Env) -> None:
    """Two trainings, each on a node that turns bad in the same node check, under a cluster cap of 1: one taint."""
    ns = "e2e-exclusion-cap"
    nodes = {"cap-a": "ip-10-0-7-31.ec2.internal", "cap-b": "ip-10-0-7-32.ec2.internal"}
    _node_excluder_binding(env, "e2e-node-excluder-cap")

    def conditions(node: str, *extra: dict[str, str]) -> None:
        env.cluster.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}, *extra]}}),
        )  # fmt: skip

    def nodes_healthy(name: str) -> dict[str, Any] | None:
        s = env.status(ns, name)
        return s if _nodes_healthy(s).get("status") == "True" else None

    try:
        for name, node in nodes.items():
            env.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            conditions(node)
            _excluding_training_on(env, ns, name, node, excludeSeconds=3600)
        for name in nodes:
            wait_for(
                lambda name=name: nodes_healthy(name), JOB_TIMEOUT, what=f"{name} on a healthy node", interval=POLL
            )
        # Both nodes turn bad while the operator is stopped: its next node check judges both trainings at once.
        assert env.operator.proc is not None
        env.operator.proc.send_signal(signal.SIGSTOP)
        try:
            xid = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error", "message": "x"}
            for node in nodes.values():
                conditions(node, xid)
        finally:
            env.operator.proc.send_signal(signal.SIGCONT)

        def one_excluded() -> list[str] | None:
            found = [
                n
                for n in nodes.values()
                if "training.fsdp.dev/excluded" in env.get("node", None, n)["metadata"].get("labels", {})
            ]
            return found or None

        wait_for(one_excluded, JOB_TIMEOUT, what="a node excluded", interval=POLL)
        held = f"not excluded: 1 node(s) of the cluster are excluded already, the operator's limit ({CLUSTER_CAP_ENV})"

        def the_other_held() -> list[str] | None:
            notes = [_nodes_healthy(env.status(ns, name)).get("message", "") for name in nodes]
            return notes if any(held in n for n in notes) else None

        notes = wait_for(the_other_held, JOB_TIMEOUT, what="the second training held by the cap", interval=POLL)
        # The check that held the second training counted the first one's taint: one node, not two.
        assert len(one_excluded() or []) == 1, notes
        excluded = [len(env.status(ns, name).get("excludedNodes") or []) for name in nodes]
        assert sorted(excluded) == [0, 1], excluded
    finally:
        for node in nodes.values():
            env.cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")
        env.cluster.kubectl("delete", "clusterrolebinding", "e2e-node-excluder-cap", "--ignore-not-found")


# --- restarts ------------------------------------------------------------------------------------


def test_kill_right_after_create_leaves_no_duplicates_and_converges(env: Env) -> None:
    ns, n = "e2e-restart", 8
    env.cluster.create_namespace(ns)
    docs = [training(f"t{i}", ns) for i in range(n)]
    env.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    # Kill -9 as soon as the first job exists: the others are mid-reconcile.
    wait_for(lambda: env.items("pytorchjob", ns), JOB_TIMEOUT, interval=0.02, what="a first PyTorchJob")
    env.operator.kill()
    before = {j["metadata"]["name"]: j["metadata"]["uid"] for j in env.items("pytorchjob", ns)}
    assert 1 <= len(before) <= n

    env.operator.start()

    def converged() -> bool:
        statuses = [env.status(ns, f"t{i}") for i in range(n)]
        assert all(s.get("phase") == "Created" and s.get("observedGeneration") == 1 for s in statuses), statuses
        return True

    wait_for(converged, 60, what="every training to converge after the restart", interval=POLL)
    jobs = env.items("pytorchjob", ns)
    assert sorted(j["metadata"]["name"] for j in jobs) == sorted(f"t{i}" for i in range(n))
    # Jobs created before the kill are the same objects, not replacements.
    assert {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs if j["metadata"]["name"] in before} == before
    assert len(env.items("configmap", ns, "training.fsdp.dev/job")) == n
    assert len(env.items("podmonitor", ns)) == n
    for i in range(n):
        assert env.event_reasons(ns, f"t{i}").count("JobCreated") <= 1


def test_operator_reconnects_after_an_api_server_restart(env: Env) -> None:
    ns, name = "e2e-apiserver", "survivor"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    window_start = len(env.operator.log())
    env.cluster.stop_apiserver()
    env.cluster.start_apiserver()
    assert env.operator.alive()
    # A change made after the restart reaches the job: the watch was re-established.
    env.patch_spec(ns, name, {"suspend": True})
    wait_for(
        lambda: (env.get("pytorchjob", ns, name) or {})["spec"]["runPolicy"].get("suspend") is True,
        90,
        what="the post-restart change to reach the PyTorchJob",
        interval=POLL,
    )
    env.wait_status(ns, name, "phase Suspended after the restart", timeout=60, phase="Suspended")
    # A restarted API server answers 403 until its RBAC caches are filled: not the operator's RBAC.
    env.restart_windows.append((window_start, len(env.operator.log())))


def _sample(metrics_text: str, name: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


SUCCESSES = 'fsdp_operator_reconciles_total{result="success"}'


def test_a_second_instance_with_the_same_peering_pauses_until_the_first_leaves(env: Env) -> None:
    first_id = "fsdp-operator-e2e-0"
    second = env.install.process(env.workdir / "second.log", priority=0, scrape_interval=0.5)
    second.start()
    try:

        def peers() -> dict[str, Any]:
            return dict((env.get("clusterkopfpeering", None, PEERING) or {}).get("status") or {})

        both = wait_for(
            lambda: len(peers()) == 2 and peers(), 30, what="both instances in the peering object", interval=POLL
        )
        assert {k: v["priority"] for k, v in both.items()} == {first_id: 100, **{k: 0 for k in both if k != first_id}}

        ns = "e2e-peering"
        env.apply_training(ns, "once")
        env.wait_job(ns, "once")
        env.wait_status(ns, "once", "the active instance's status", phase="Created")
        env.wait_events(ns, "once", "JobCreated")
        # The paused instance saw the same events and did nothing with them.
        assert _sample(second.metrics(), SUCCESSES) == 0
        assert _sample(second.metrics(), 'fsdp_operator_status_updates_total{source="job"}') == 0
        assert "Resuming operations" not in second.log()

        # The first leaves gracefully (removing itself from the peering): the second takes over.
        env.operator.stop()
        wait_for(lambda: "Resuming operations" in second.log(), 30, what="the second instance to resume", interval=POLL)
        env.apply_training(ns, "takeover")
        env.wait_job(ns, "takeover")
        assert _sample(second.metrics(), SUCCESSES) >= 1
    finally:
        second.stop()
        env.operator.start()
    wait_for(lambda: set(peers()) == {first_id}, 30, what="only the first instance left in the peering", interval=POLL)


def test_operator_metrics_and_liveness(env: Env, succeeded: tuple[str, str], failed: tuple[str, str]) -> None:
    """Counters and gauges after a create; a Succeeded and a Failed training are among those counted."""
    env.apply_training("e2e-metrics", "counted")
    env.wait_events("e2e-metrics", "counted", "JobCreated")  # posted after the apply's status write

    def samples() -> dict[str, float]:
        out = {}
        for line in env.operator.metrics().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    got = wait_for(
        lambda: (s := samples())[SUCCESSES] >= 1 and s, 10, what="a successful reconcile in the metrics", interval=POLL
    )
    assert got["fsdp_operator_reconcile_duration_seconds_count"] == got[SUCCESSES]
    assert got["fsdp_operator_create_to_job_seconds_count"] >= 1
    assert got['fsdp_operator_status_updates_total{source="apply"}'] >= 1
    # Every training in the cluster is counted once, under the phase its status shows.
    everything = json.loads(env.cluster.kubectl("get", "fsdptrainings", "-A", "-o", "json").stdout)["items"]
    by_phase: dict[str, int] = {}
    for t in everything:
        phase = t.get("status", {}).get("phase", "Pending")
        by_phase[phase] = by_phase.get(phase, 0) + 1
    gauge = {k: v for k, v in got.items() if k.startswith("fsdp_operator_trainings{")}
    assert {k.split('"')[1]: int(v) for k, v in gauge.items() if v} == by_phase
    assert by_phase["Succeeded"] >= 1 and by_phase["Failed"] >= 1
    # kopf caches probe results for 10 s.
    wait_for(
        lambda: json.loads(env.operator.liveness())["trainings"] == len(everything),
        20,
        what="the liveness probe",
        interval=POLL,
    )


def test_namespaced_mode_needs_only_a_rolebinding(env: Env) -> None:
    """`fsdp-operator run -n NS` with the same ClusterRole bound by a RoleBinding in NS only."""
    ns, sa = "e2e-namespaced", "ns-operator"
    c = env.cluster
    c.create_namespace(ns)
    kubeconfig = c.serviceaccount_kubeconfig(ns, sa)
    c.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "fsdp-operator", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fsdp-operator"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        }
    )
    wait_for(
        lambda: can_i(c, kubeconfig, "watch", FSDPTRAININGS, "-n", ns) == "yes",
        30,
        what="the RoleBinding",
        interval=POLL,
    )
    assert can_i(c, kubeconfig, "list", "pytorchjobs.kubeflow.org", "-A") == "no"
    # The cluster-wide instance would serve this namespace too: stop it meanwhile.
    env.operator.stop()
    namespaced = env.install.process(env.workdir / "namespaced.log", kubeconfig=kubeconfig, namespace=ns, priority=100)
    try:
        namespaced.start()
        env.apply_training(ns, "local")
        env.wait_job(ns, "local")
        env.wait_status(ns, "local", "status from the namespaced operator", phase="Created")
        assert env.get("kopfpeering", ns, PEERING) is not None  # created at start-up, in the namespace
        assert not permission_errors(namespaced.log())
    finally:
        namespaced.stop()
        env.operator.start()


def manifests(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(kustomize(path)) if d}


def test_kustomize_default_installs_a_locked_down_single_replica_operator(env: Env) -> None:
    objs = manifests(REPO_ROOT / "kustomize" / "default")
    deploy = objs[("Deployment", "fsdp-operator")]
    assert deploy["metadata"]["namespace"] == "fsdp-system"
    assert (deploy["spec"]["replicas"], deploy["spec"]["strategy"]) == (1, {"type": "Recreate"})
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/fsdp-k8s/operator:0.1.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080, "metrics": 8081}
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--metrics-port=8081" in container["args"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(container["resources"]) == {"requests", "limits"}
    # Namespaced by default: the rules are bound in the served namespace only.
    assert "--namespace=fsdp-training" in container["args"] and "--all-namespaces" not in container["args"]
    binding = objs[("RoleBinding", "fsdp-operator")]
    assert binding["metadata"]["namespace"] == "fsdp-training"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fsdp-operator", "namespace": "fsdp-system"}]
    assert not [k for k in objs if k[0] == "ClusterRoleBinding"]
    assert ("CustomResourceDefinition", "fsdptrainings.training.fsdp.dev") in objs
    assert ("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev") in objs

    # The API server accepts all of it, and the pod passes the restricted Pod Security level.
    c = env.cluster
    c.apply(objs[("Namespace", "fsdp-system")])
    c.apply(objs[("Namespace", "fsdp-training")])
    # --force-conflicts: objects of the same names exist already (this module's cluster-wide install).
    default = kustomize(REPO_ROOT / "kustomize" / "default")
    c.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-", input=default)
    bare_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fsdp-operator-dry-run", "namespace": "fsdp-system"},
        "spec": pod,
    }
    res = c.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(bare_pod))
    assert "Warning" not in res.stderr, res.stderr
    monitor = manifests(REPO_ROOT / "kustomize" / "prometheus")[("ServiceMonitor", "fsdp-operator")]
    service = objs[("Service", "fsdp-operator-metrics")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_the_default_install_serves_one_namespace_as_its_service_account(env: Env) -> None:
    """kustomize/default binds the operator's rules in fsdp-training only: proven as its ServiceAccount."""
    c = env.cluster
    install = install_operator(c, deploy=False)  # kustomize/default, in fsdp-system
    kubeconfig = install.kubeconfig
    assert kubeconfig is not None
    for verb, resource in (("create", "configmaps"), ("patch", "configmaps"), ("create", "pytorchjobs.kubeflow.org")):
        assert can_i(c, kubeconfig, verb, resource, "-n", "fsdp-training") == "yes", (verb, resource)
    # Nothing elsewhere: no ConfigMaps in kube-system (aws-auth), no pods or jobs in other namespaces.
    for verb, resource, where in (
        ("create", "configmaps", ("-n", "kube-system")),
        ("patch", "configmaps", ("-n", "kube-system")),
        ("get", "configmaps", ("-n", "kube-system")),
        ("create", "pytorchjobs.kubeflow.org", ("-n", "default")),
        ("delete", "pods", ("-n", "kube-system")),
        ("list", "pytorchjobs.kubeflow.org", ("-A",)),
        ("list", "configmaps", ("-A",)),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", ()),
    ):
        assert can_i(c, kubeconfig, verb, resource, *where) == "no", (verb, resource, where)
    # The cluster-wide instance would serve these namespaces too: stop it meanwhile.
    env.operator.stop()
    op = install.process(env.workdir / "default.log", priority=100)
    try:
        op.start()
        env.apply_training("fsdp-training", "served")
        env.wait_job("fsdp-training", "served")
        env.wait_status("fsdp-training", "served", "status from the default install", phase="Created")
        env.apply_training("e2e-unserved", "ignored")
        time.sleep(3)
        assert env.get("pytorchjob", "e2e-unserved", "ignored") is None
        assert not (env.get("fsdptraining", "e2e-unserved", "ignored") or {}).get("status")
        assert not permission_errors(op.log())
    finally:
        op.stop()
        env.operator.start()


def test_the_deployments_command_line_runs_the_operator(env: Env) -> None:
    """`fsdp-operator run` with the Deployment's args and env (ports moved to free ones), nothing added."""
    deploy = manifests(REPO_ROOT / "kustomize" / "default")[("Deployment", "fsdp-operator")]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    op = OperatorProcess(
        env.kubeconfig,
        env.workdir / "deployment-args.log",
        container=container,
        pod_name="fsdp-operator-from-deployment",
    )
    assert op.command()[0] == str(Path(sys.executable).with_name("fsdp-operator"))
    assert op.command()[1:] == [
        a.replace("0.0.0.0:8080", f"127.0.0.1:{op.liveness_port}").replace("=8081", f"={op.metrics_port}")
        for a in container["args"]
    ]
    env.operator.stop()  # same peering priority: the two would pause each other
    # Its peering object lives in the namespace it serves: there whichever test ran before (pytest -n).
    env.cluster.create_namespace("fsdp-training")
    try:
        op.start()
        # The namespace kustomize/default serves (its --namespace argument).
        env.apply_training("fsdp-training", "via-cli")
        env.wait_status("fsdp-training", "via-cli", "status from the CLI-started operator", phase="Created")
        assert "priority 100" in op.log()
    finally:
        op.stop()
        env.operator.start()


def test_no_permission_errors_in_the_operator_log(env: Env) -> None:
    log = env.operator.log()
    for start, end in reversed(env.restart_windows):
        log = log[:start] + log[end:]
    assert not permission_errors(log)


# --- garbage collection (needs kube-controller-manager) -----------------------------------------


@pytest.mark.e2e
def test_deleting_the_training_garbage_collects_its_objects(env: Env) -> None:
    ns, name = "e2e-gc", "gone"
    env.apply_training(ns, name)
    env.wait_job(ns, name)
    with ControlPlane(env.cluster, components=[CONTROLLER_MANAGER]):
        env.cluster.kubectl("delete", "fsdptraining", name, "-n", ns, "--wait=true", timeout=120)
        for kind, obj in (("pytorchjob", name), ("configmap", f"{name}-trainer"), ("podmonitor", name)):
            wait_for(
                lambda k=kind, o=obj: env.get(k, ns, o) is None, 60, what=f"{kind} {obj} to be collected", interval=POLL
            )
        # The operator must not resurrect the job of a deleted training.
        assert env.get("pytorchjob", ns, name) is None
