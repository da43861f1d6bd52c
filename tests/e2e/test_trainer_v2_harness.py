"""Kubeflow Trainer v2 on the whole local cluster: TrainJobs run through the real Trainer and JobSet
controllers (built from their Go modules) down to pods on the node agent, before any fsdp-operator is involved.

A ClusterTrainingRuntime of our own (the shape of upstream's torch-distributed,
one replicated Job ``node``) and TrainJobs of two nodes whose pods find each
other the way torchrun would: ``PET_NODE_RANK`` from the Job completion index,
``PET_MASTER_ADDR`` (``<trainjob>-node-0-0.<trainjob>``) resolved through the
JobSet's headless Service, a TCP connection from rank 1 to rank 0 on
``PET_MASTER_PORT``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fsdp_localcluster.trainer_v2 import STATUS_SERVICE, TrainerV2
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

from tests.e2e.timings import record

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "fsdp-harness-torch"
IMAGE = "ghcr.io/fsdp-k8s/trainer:0.1.0"  # the node agent runs the command; the image only names it
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

# Rank 0 listens on the master port; rank 1 resolves the master's name and connects.
# Both print what they saw. Names in a command are resolved when the node agent
# starts it (docs/e2e.md), so the env holds the master's address already.
RENDEZVOUS = """\
import os, socket, sys, time
rank = int(os.environ["PET_NODE_RANK"])
port = int(os.environ["PET_MASTER_PORT"])
master = socket.gethostbyname(os.environ["PET_MASTER_ADDR"])
print(f"rank={rank} nnodes={os.environ['PET_NNODES']} nproc={os.environ['PET_NPROC_PER_NODE']} "
      f"master={master} hostname={os.environ['HOSTNAME']}", flush=True)
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.listen()
    s.settimeout(45)
    conn, _ = s.accept()
    print(f"rank 0 heard from rank {conn.recv(16).decode()}", flush=True)
else:
    deadline = time.monotonic() + 45
    while True:
        try:
            c = socket.create_connection((master, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    c.sendall(str(rank).encode())
    c.close()
sys.exit(int(os.environ.get("EXIT_CODE_OF_RANK_" + str(rank), "0")))
"""


@pytest.fixture(scope="module")
def trainer(whole: WholeCluster) -> Iterator[TrainerV2]:
    """JobSet and Trainer v2 next to the session's control plane, with our ClusterTrainingRuntime."""
    t = time.monotonic()
    # With the TrainJobStatus gate on: test_progress_reaches_the_trainjob_status_through_the_status_server.
    tr = TrainerV2(whole.control_plane, status_server=True).start()
    whole.node_agent.network.serve_from_host(*STATUS_SERVICE)
    record("trainer_v2_start_s", time.monotonic() - t)
    try:
        whole.cluster.apply(cluster_training_runtime())
        yield tr
    finally:
        tr.stop()


def cluster_training_runtime() -> dict[str, Any]:
    """Upstream's torch-distributed shape; Jobs fail on the first failed pod so that a failure ends the TrainJob."""
    return {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {
                                    "backoffLimit": 0,
                                    "template": {
                                        "spec": {
                                            # What the ServiceAccount admission plugin sets on a real
                                            # cluster (off here): the status plugin's projected token needs it.
                                            "serviceAccountName": "default",
                                            "restartPolicy": "Never",
                                            "containers": [{"name": "node", "image": IMAGE}],
                                        }
                                    },
                                },
                            },
                        }
                    ]
                }
            },
        },
    }


def trainjob(
    name: str, namespace: str, env: dict[str, str] | None = None, script: str = RENDEZVOUS, nodes: int = 2
) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {
                "image": IMAGE,
                "command": ["python", "-c", script],
                "numNodes": nodes,
                "numProcPerNode": 1,
                "resourcesPerNode": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
            },
        },
    }


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == ctype), None)


def wait_terminal(whole: WholeCluster, trainer: TrainerV2, name: str, ns: str, timeout: float = 60) -> dict[str, Any]:
    def terminal() -> dict[str, Any] | None:
        tj = whole.get("trainjob", name, ns)
        done = any((condition(tj, t) or {}).get("status") == "True" for t in ("Complete", "Failed"))
        return tj if done else None

    try:
        return wait_for(terminal, timeout, f"TrainJob {ns}/{name} to finish")
    except Exception as e:
        out = whole.kubectl("get", "trainjobs,jobsets,jobs,pods,services", "-n", ns, "-o", "wide", check=False)
        raise AssertionError(f"{e}\n{out.stdout}{out.stderr}\n{whole.describe(ns)}\n{trainer.logs(30)}") from e


def pod_logs(whole: WholeCluster, name: str, ns: str) -> dict[str, str]:
    """Each pod's log, by its hostname (``<trainjob>-node-0-<index>``)."""
    pods = whole.list("pods", ns, f"{JOBSET_NAME}={name}")
    return {p["spec"]["hostname"]: whole.node_agent.logs(ns, p["metadata"]["name"]) for p in pods}


def test_trainjob_of_two_nodes_completes(whole: WholeCluster, trainer: TrainerV2) -> None:
    ns, name = "tj-complete", "rdzv"
    whole.cluster.create_namespace(ns)
    t = time.monotonic()
    whole.cluster.apply(trainjob(name, ns))
    tj = wait_terminal(whole, trainer, name, ns)
    record("trainjob_two_nodes_complete_s", time.monotonic() - t)
    logs = pod_logs(whole, name, ns)
    assert (condition(tj, "Complete") or {}).get("status") == "True", f"{tj.get('status')}\n{logs}"

    # The JobSet the Trainer rendered: one Indexed Job of two pods, its headless Service.
    jobset = whole.get("jobset", name, ns)
    assert jobset is not None
    assert whole.get("service", name, ns) is not None
    pods = whole.list("pods", ns, f"{JOBSET_NAME}={name}")
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"{name}-node-0-0", f"{name}-node-0-1"]
    assert all(p["spec"]["subdomain"] == name for p in pods)
    assert all(p["status"]["phase"] == "Succeeded" for p in pods), [p["status"] for p in pods]
    master_ip = next(p["status"]["podIP"] for p in pods if p["spec"]["hostname"] == f"{name}-node-0-0")

    seen = {}
    for hostname, log in logs.items():
        m = re.search(r"rank=(\d) nnodes=2 nproc=1 master=(\S+) hostname=(\S+)", log)
        assert m, f"{hostname}: {log}"
        seen[int(m.group(1))] = (m.group(2), m.group(3))
    # Ranks from the Job completion index, the master's name resolved to rank 0's pod.
    assert seen == {0: (master_ip, f"{name}-node-0-0"), 1: (master_ip, f"{name}-node-0-1")}, logs
    assert "rank 0 heard from rank 1" in logs[f"{name}-node-0-0"], logs


def test_trainjob_fails_when_a_node_fails(whole: WholeCluster, trainer: TrainerV2) -> None:
    ns, name = "tj-failed", "rdzv"
    whole.cluster.create_namespace(ns)
    t = time.monotonic()
    whole.cluster.apply(trainjob(name, ns, env={"EXIT_CODE_OF_RANK_1": "3"}))
    tj = wait_terminal(whole, trainer, name, ns)
    record("trainjob_failed_s", time.monotonic() - t)
    failed = condition(tj, "Failed")
    assert failed is not None and failed["status"] == "True", tj.get("status")
    assert (condition(tj, "Complete") or {}).get("status") != "True"
    jobset_failed = condition(whole.get("jobset", name, ns), "Failed")
    assert jobset_failed is not None and jobset_failed["status"] == "True"


# Rank 0's reporter, as the trainer opens it from the variables Trainer's TrainJobStatus plugin set:
# four steps of ten, then the same post to another TrainJob's address, which its token may not update.
STATUS_REPORT = """\
import os
from pathlib import Path
from fsdp_trainer.tracking.background import PointsLost
from fsdp_trainer.tracking.trainjob_status import TrainJobStatusReporter
from fsdp_api.trainer_config import TrainerConfig
cfg = TrainerConfig.model_validate({"model": {"preset": "tiny"}, "training": {"maxSteps": 10}})
reporter = TrainJobStatusReporter.from_env(cfg, os.environ)
print("status url", reporter.endpoint, flush=True)
for step in range(1, 5):
    reporter.write(step, {"train/loss": 5.0 - step, "train/step_duration_seconds": 2.0})
reporter.flush()
print("posted", flush=True)
other = TrainJobStatusReporter(
    reporter.endpoint.replace("/trainjobs/progress/", "/trainjobs/someone-else/"),
    reporter.ca_file, reporter.token_file, 10,
)
try:
    other.write(1, {"train/loss": 1.0})  # the first point is posted at once
except PointsLost as e:
    print("refused:", e, flush=True)
"""


def test_progress_reaches_the_trainjob_status_through_the_status_server(
    whole: WholeCluster, trainer: TrainerV2
) -> None:
    """Trainer v2.3's alpha TrainJobStatus: the plugin's env, token and CA in the pod, our reporter's post,
    the status server's token check, TrainJob.status.trainerStatus."""
    ns, name = "tj-status", "progress"
    whole.cluster.create_namespace(ns)
    whole.cluster.apply(trainjob(name, ns, script=STATUS_REPORT, nodes=1))
    tj = wait_terminal(whole, trainer, name, ns)
    logs = pod_logs(whole, name, ns)
    log = logs[f"{name}-node-0-0"]
    assert (condition(tj, "Complete") or {}).get("status") == "True", f"{tj.get('status')}\n{logs}"
    assert "posted" in log, log
    status = tj["status"]["trainerStatus"]
    assert status["progressPercentage"] == 40
    assert status["estimatedRemainingSeconds"] == 12  # 6 steps left at 2 s
    assert {m["name"]: m["value"] for m in status["metrics"]} == {
        "train/loss": "1",
        "train/step_duration_seconds": "2",
    }
    assert status["lastUpdatedTime"]
    # The token's audience names this TrainJob: the server refuses it for another.
    assert "refused: the TrainJob status server answered HTTP 403: Forbidden" in log, log
