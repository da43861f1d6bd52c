"""The whole cluster itself, with hand-written PyTorchJobs: the real training operator, scheduler,
garbage collector and the local node agent, before any fsdp-operator is involved."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fsdp_localcluster.apiserver import KubectlError
from fsdp_localcluster.node_agent import container_pids
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

from tests.e2e.timings import record

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
IMAGE = "ghcr.io/fsdp-k8s/trainer:0.1.0"

# Two processes meet through torchrun's c10d rendezvous (hosted by worker 0's
# torchrun, reached through its Service name) and all-reduce over gloo.
ALLREDUCE = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} allreduce={t.item()} "
      f"node_rank={os.environ['GROUP_RANK']} master={os.environ['MASTER_ADDR']}", flush=True)
dist.destroy_process_group()
"""


def pytorchjob(
    name: str,
    namespace: str,
    command: list[str],
    *,
    workers: int = 1,
    restart_policy: str = "OnFailure",
    extra_pod: dict[str, Any] | None = None,
    extra_container: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Worker-only PyTorchJob (the renderer's shape) on the GPU nodes, one pod per node."""
    pod: dict[str, Any] = {
        "tolerations": [GPU_TOLERATION],
        "nodeSelector": {"karpenter.sh/nodepool": "gpu"},
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": name}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "containers": [
            {
                "name": "pytorch",
                "image": IMAGE,
                "command": command,
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                **(extra_container or {}),
            }
        ],
        **(extra_pod or {}),
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": workers, "restartPolicy": restart_policy, "template": {"spec": pod}}
            }
        },
    }


def job_condition(whole: WholeCluster, name: str, namespace: str) -> Callable[[], str | None]:
    """A check returning the PyTorchJob's terminal condition (Succeeded/Failed) once it has one."""

    def check() -> str | None:
        job = whole.get("pytorchjob", name, namespace) or {}
        true = [c["type"] for c in (job.get("status") or {}).get("conditions", []) if c["status"] == "True"]
        return next((t for t in ("Succeeded", "Failed") if t in true), None)

    return check


@pytest.fixture
def ns(whole: WholeCluster, request: pytest.FixtureRequest) -> str:
    name = "pj-" + request.node.name.removeprefix("test_").replace("_", "-")[:40]
    whole.cluster.create_namespace(name)
    return name


def test_nodes_look_like_karpenter_gpu_nodes_and_keep_their_leases(whole: WholeCluster) -> None:
    node = whole.get("node", "gpu-0")
    assert node is not None
    labels, status = node["metadata"]["labels"], node["status"]
    assert labels["karpenter.sh/nodepool"] == "gpu"
    assert labels["karpenter.sh/capacity-type"] == "on-demand"
    assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert status["allocatable"]["nvidia.com/gpu"] == "8"
    assert status["allocatable"]["vpc.amazonaws.com/efa"] == "32"
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    # The node lifecycle controller would taint a node whose Lease stops moving.
    first = whole.get("lease", "gpu-0", "kube-node-lease")
    assert first is not None
    renewed = wait_for(
        lambda: (
            (lease := whole.get("lease", "gpu-0", "kube-node-lease"))
            and lease["spec"]["renewTime"] != first["spec"]["renewTime"]
            and lease
        ),
        30,
        "the gpu-0 Lease to be renewed",
    )
    assert renewed["spec"]["holderIdentity"] == "gpu-0"
    node = whole.get("node", "gpu-0")
    assert node is not None
    assert not [t for t in node["spec"]["taints"] if t["key"].startswith("node.kubernetes.io/")]


def test_webhook_rejects_a_job_without_the_pytorch_container(whole: WholeCluster, ns: str) -> None:
    job = pytorchjob("nocontainer", ns, ["true"])
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    with pytest.raises(KubectlError) as err:
        whole.cluster.apply(job)
    assert (
        'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the request' in err.value.stderr
    )
    assert "must have at least one container with name pytorch" in err.value.stderr


def test_torchrun_rendezvous_and_gloo_allreduce_across_two_pods(whole: WholeCluster, ns: str) -> None:
    whole.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "allreduce", "namespace": ns},
            "data": {"allreduce.py": ALLREDUCE},
        }
    )
    command = [
        "torchrun", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=ar-worker-0:29400", "--rdzv-id=ar", "/opt/job/allreduce.py",
    ]  # fmt: skip
    job = pytorchjob(
        "ar",
        ns,
        command,
        workers=2,
        extra_pod={"volumes": [{"name": "job", "configMap": {"name": "allreduce"}}]},
        extra_container={"volumeMounts": [{"name": "job", "mountPath": "/opt/job"}]},
    )
    t = time.monotonic()
    whole.cluster.apply(job)
    outcome = wait_for(job_condition(whole, "ar", ns), 180, "PyTorchJob ar to finish")
    record("pytorchjob_2pod_allreduce_s", time.monotonic() - t)
    assert outcome == "Succeeded", whole.describe(ns)
    pods = {p["metadata"]["name"]: p for p in whole.list("pods", ns)}
    assert {p["spec"]["nodeName"] for p in pods.values()} == {"gpu-0", "gpu-1"}  # anti-affinity, one per node
    for name in ("ar-worker-0", "ar-worker-1"):
        env = {e["name"]: e.get("value") for e in pods[name]["spec"]["containers"][0]["env"]}
        assert env["PET_NNODES"] == "2"  # the training operator's own environment
        logs = whole.kubectl("logs", name, f"--namespace={ns}").stdout  # served by the agent's kubelet endpoint
        assert "allreduce=3.0" in logs, logs
        status = pods[name]["status"]["containerStatuses"][0]
        assert status["state"]["terminated"]["exitCode"] == 0
        assert pods[name]["status"]["phase"] == "Succeeded"


def test_on_failure_restarts_the_container_in_place(whole: WholeCluster, ns: str) -> None:
    # The first run leaves a mark in the pod's emptyDir and fails; the restart finds it and succeeds.
    script = "test -f /scratch/ran && exit 0; touch /scratch/ran; echo first run fails; exit 3"
    job = pytorchjob(
        "flaky",
        ns,
        ["sh", "-c", script],
        extra_pod={"volumes": [{"name": "scratch", "emptyDir": {}}]},
        extra_container={"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
    )
    whole.cluster.apply(job)
    assert wait_for(job_condition(whole, "flaky", ns), 120, "PyTorchJob flaky to finish") == "Succeeded"
    pod = whole.get("pod", "flaky-worker-0", ns)
    assert pod is not None
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["state"]["terminated"]["exitCode"] == 0
    assert whole.kubectl("logs", "flaky-worker-0", "--previous", f"--namespace={ns}").stdout == "first run fails\n"


def test_deleting_the_job_garbage_collects_pods_services_and_processes(whole: WholeCluster, ns: str) -> None:
    whole.cluster.apply(pytorchjob("sleepy", ns, ["sleep", "300"], workers=2))
    agent = whole.node_agent
    running = wait_for(
        lambda: [
            w for w in (agent.find_worker(ns, f"sleepy-worker-{i}") for i in (0, 1)) if w and w.container().running
        ],
        60,
        "both sleepy pods to run",
    )
    assert len(running) == 2
    markers = [w.container().marker for w in running]
    assert all(container_pids(m) for m in markers)
    assert len(whole.list("services", ns)) == 2

    whole.kubectl("delete", "pytorchjob", "sleepy", f"--namespace={ns}", "--wait=false")
    # Background cascade by kube-controller-manager's garbage collector, then the kubelet's termination.
    wait_for(lambda: not whole.list("pods", ns) and not whole.list("services", ns), 60, "pods and services to go")
    assert not [m for m in markers if container_pids(m)]


def test_a_pod_no_node_fits_stays_pending_with_the_schedulers_reason(whole: WholeCluster, ns: str) -> None:
    job = pytorchjob("nofit", ns, ["true"])
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] = {
        "node.kubernetes.io/instance-type": "p4d.24xlarge"
    }
    whole.cluster.apply(job)

    def unschedulable() -> dict[str, Any] | None:
        pod = whole.get("pod", "nofit-worker-0", ns) or {}
        cond = [c for c in (pod.get("status") or {}).get("conditions", []) if c["type"] == "PodScheduled"]
        return cond[0] if cond and cond[0].get("reason") == "Unschedulable" else None

    cond = wait_for(unschedulable, 60, "the scheduler to give up on nofit-worker-0")
    assert cond["status"] == "False"
    assert "3 node(s) didn't match Pod's node affinity/selector" in cond["message"], json.dumps(cond)

    # Nothing ran: the job is only Created. The training operator writes that condition in its own
    # reconcile, which can come after the scheduler's verdict on a loaded machine (CI saw no status yet).
    def true_conditions() -> list[str] | None:
        job_obj = whole.get("pytorchjob", "nofit", ns) or {}
        true = [c["type"] for c in (job_obj.get("status") or {}).get("conditions", []) if c["status"] == "True"]
        return true or None

    assert wait_for(true_conditions, 60, "the training operator to mark nofit Created") == ["Created"]
