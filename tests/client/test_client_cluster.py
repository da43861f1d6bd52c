"""The Python client against a real kube-apiserver: submit, read back, wait, suspend, delete, events, metrics.

The test plays the operator's part where one is needed (it writes the status
and the pods the operator and the kubelet would); the whole-cluster tests run
the same calls against the real operator and trainer (tests/e2e/test_faults.py).
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsdp_k8s.client
import pytest
import yaml
from fsdp_k8s import ApiError, Client, ClientError, InvalidTraining, WaitTimeout
from fsdp_localcluster.apiserver import TestCluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "kustomize" / "crd" / "training.fsdp.dev_fsdptrainings.yaml"
NAMESPACE = "client-tests"


@pytest.fixture(scope="module")
def api(cluster: TestCluster) -> TestCluster:
    cluster.install_crds(CRD_FILE)
    cluster.create_namespace(NAMESPACE)
    # The ServiceAccount admission wants the namespace's default account (no controller-manager makes it here).
    cluster.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": NAMESPACE}}
    )
    return cluster


@pytest.fixture
def client(api: TestCluster) -> Client:
    return Client(NAMESPACE, kubeconfig=api.kubeconfig)


def tiny(name: str, **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "fsdptraining-tiny.yaml").read_text())
    body["metadata"] = {"name": name}
    body["spec"].update(spec)
    return body


def set_status(api: TestCluster, name: str, status: dict[str, Any]) -> None:
    """What the operator does: a merge patch of the status subresource."""
    import json

    api.kubectl(
        "patch", "fsdptraining", name, "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def test_submit_validates_here_and_reads_back_typed(client: Client, api: TestCluster) -> None:
    created = client.submit(tiny("readback"))
    assert (created.name, created.namespace, created.phase) == ("readback", NAMESPACE, "Pending")
    set_status(api, "readback", {"phase": "Running", "step": 7, "loss": 2.5, "remaining": "1m00s"})
    got = client.get("readback")
    assert (got.phase, got.status.step, got.status.loss) == ("Running", 7, 2.5)
    assert got.summary() == f"{NAMESPACE}/readback: Running | step 7/{got.max_steps} | loss 2.5000 | 1m00s left"
    assert "readback" in [t.name for t in client.list()]


def test_an_invalid_training_is_refused_before_any_api_call(client: Client) -> None:
    with pytest.raises(InvalidTraining) as refused:
        client.submit(tiny("bad", training={"maxSteps": 0}))
    assert any(p.startswith("spec.training.maxSteps") for p in refused.value.problems), refused.value.problems
    with pytest.raises(ClientError, match="not found"):
        client.get("bad")


def test_a_file_and_a_model_submit_like_kubectl_apply(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(tiny("from-file")))
    assert client.submit(path).name == "from-file"
    model = client.validate(tiny("from-model"))
    assert client.submit(model).name == "from-model"
    # The second create of one name is the API server's own answer.
    with pytest.raises(ApiError) as again:
        client.submit(path)
    assert again.value.reason == "AlreadyExists"


def test_wait_returns_the_phase_and_times_out_saying_where_it_stood(client: Client, api: TestCluster) -> None:
    client.submit(tiny("waiting"))
    seen: list[str] = []

    def operator_part() -> None:
        time.sleep(1)
        set_status(api, "waiting", {"phase": "Running", "step": 3})
        time.sleep(1)
        set_status(api, "waiting", {"phase": "Succeeded", "step": 300})

    worker = threading.Thread(target=operator_part)
    worker.start()
    done = client.wait("waiting", timeout=60, poll_seconds=0.2, progress=lambda t: seen.append(t.phase))
    worker.join()
    assert done.phase == "Succeeded" and done.status.step == 300
    assert seen[0] == "Pending" and seen[-1] == "Succeeded" and "Running" in seen

    client.submit(tiny("stuck"))
    with pytest.raises(WaitTimeout, match=r"stuck did not reach Running within 0.5 s: .*stuck: Pending"):
        client.wait("stuck", ("Running",), timeout=0.5, poll_seconds=0.1)


def test_a_failure_while_waiting_for_running_says_why(client: Client, api: TestCluster) -> None:
    client.submit(tiny("fails"))
    set_status(api, "fails", {"phase": "Failed", "message": "the trainer's check refused its config"})
    with pytest.raises(ClientError, match="fails failed: the trainer's check refused its config"):
        client.wait("fails", ("Running",), timeout=10, poll_seconds=0.1)


def test_suspend_resume_and_delete(client: Client) -> None:
    client.submit(tiny("pausing"))
    assert client.suspend("pausing").body["spec"]["suspend"] is True
    assert client.resume("pausing").body["spec"]["suspend"] is False
    client.delete("pausing", wait=True, timeout=30)
    with pytest.raises(ClientError, match=f"FSDPTraining {NAMESPACE}/pausing not found"):
        client.delete("pausing")


def test_events_of_the_training_oldest_first(client: Client, api: TestCluster) -> None:
    client.submit(tiny("eventful"))
    for i, (reason, stamp) in enumerate((("Stalled", "2026-01-01T00:00:02Z"), ("Created", "2026-01-01T00:00:01Z"))):
        api.apply(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"eventful.{i}", "namespace": NAMESPACE},
                "involvedObject": {"kind": "FSDPTraining", "name": "eventful", "namespace": NAMESPACE},
                "reason": reason,
                "message": f"{reason} it",
                "type": "Normal",
                "lastTimestamp": stamp,
                "firstTimestamp": stamp,
            }
        )
    assert [(e.reason, e.object) for e in client.events("eventful")] == [
        ("Created", "FSDPTraining/eventful"),
        ("Stalled", "FSDPTraining/eventful"),
    ]


# --- metrics: through the API server's pod proxy, else from the pod's address ----------------

TRAINER_TEXT = (
    "# TYPE fsdp_train_step gauge\n"
    'fsdp_train_step{job_name="m",node_rank="1",local_rank="0"} 11\n'
    'fsdp_train_step{job_name="m",node_rank="0",local_rank="0"} 12\n'
    "# TYPE fsdp_train_loss gauge\n"
    'fsdp_train_loss{job_name="m",node_rank="0",local_rank="0"} 3.25\n'
    "# TYPE fsdp_train_max_steps gauge\n"
    'fsdp_train_max_steps{job_name="m",node_rank="0",local_rank="0"} 300\n'
)


class _Trainer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = TRAINER_TEXT.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def outward_address() -> str | None:
    """This machine's address on its default route: one the API server proxies to (it refuses loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ip.startswith("127.") else ip


@pytest.fixture
def trainer_at(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    ip = request.param if request.param != "outward" else outward_address()
    if ip is None:
        pytest.skip("this machine has no address outside loopback for the API server to proxy to")
    server = http.server.ThreadingHTTPServer((ip, 0), _Trainer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ip, server.server_address[1]
    server.shutdown()
    server.server_close()


def worker_pod(name: str, rank: int) -> dict[str, Any]:
    """Node rank ``rank`` of a PyTorchJob's pods, as the training operator labels them."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-worker-{rank}",
            "namespace": NAMESPACE,
            "labels": {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-index": str(rank)},
        },
        "spec": {"containers": [{"name": "pytorch", "image": "trainer"}]},
    }


@pytest.mark.parametrize("trainer_at", ["outward", "127.0.0.1"], indirect=True, ids=["proxied", "direct"])
def test_metrics_of_rank_0_through_the_proxy_or_from_the_pod(
    client: Client,
    api: TestCluster,
    trainer_at: tuple[str, int],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ip, port = trainer_at
    proxied = request.node.callspec.id == "proxied"
    direct_reads: list[str] = []
    read_directly = fsdp_k8s.client._direct_metrics

    def direct(pod_ip: str, pod_port: int) -> str:
        # Through the proxy the pod is never read directly; on loopback the API server refuses to proxy.
        assert not proxied, "the API server's proxy was not used"
        direct_reads.append(pod_ip)
        return read_directly(pod_ip, pod_port)

    monkeypatch.setattr(fsdp_k8s.client, "_direct_metrics", direct)
    name = "m-" + request.node.callspec.id
    client.submit(tiny(name, metrics={"enabled": True, "port": port}))
    for rank in (1, 0):
        api.apply(worker_pod(name, rank))
        api.kubectl(
            "patch", "pod", f"{name}-worker-{rank}", "-n", NAMESPACE, "--subresource=status", "--type=merge",
            "-p", f'{{"status": {{"phase": "Running", "podIP": "{ip}", "podIPs": [{{"ip": "{ip}"}}]}}}}',
        )  # fmt: skip
    assert client.pod(name, 1)["metadata"]["name"] == f"{name}-worker-1"
    m = client.metrics(name)
    # Rank 0's figures, whichever rank the endpoint lists first.
    assert (m.step, m.loss, m.max_steps) == (12, 3.25, 300)
    assert m.as_dict()["fsdp_train_loss"] == 3.25
    # One read each: which pod holds node rank 1, then node rank 0's figures.
    assert direct_reads == ([] if proxied else [ip, ip])


def _serve(ip: str, port: int, text: str) -> http.server.ThreadingHTTPServer:
    class One(_Trainer):
        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer((ip, port), One)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def node_text(node_rank: int, loss: float) -> str:
    labels = f'job_name="n",node_rank="{node_rank}",local_rank="0"'
    return (
        f"# TYPE fsdp_train_step gauge\nfsdp_train_step{{{labels}}} 7\n"
        f"# TYPE fsdp_train_loss gauge\nfsdp_train_loss{{{labels}}} {loss}\n"
    )


def test_node_rank_0_is_the_pod_whose_series_say_so_whatever_its_index(client: Client, api: TestCluster) -> None:
    """torchrun's c10d rendezvous numbers the nodes by host name and pid: pod index 1 can hold node rank 0."""
    first = _serve("127.0.0.1", 0, node_text(1, 2.5))
    port = first.server_address[1]
    try:
        second = _serve("127.0.0.2", port, node_text(0, 1.5))
    except OSError:
        first.shutdown()
        pytest.skip("127.0.0.2 is not served by this machine's loopback")
    try:
        client.submit(tiny("swapped", metrics={"enabled": True, "port": port}))
        for index, ip in ((0, "127.0.0.1"), (1, "127.0.0.2")):
            api.apply(worker_pod("swapped", index))
            api.kubectl(
                "patch", "pod", f"swapped-worker-{index}", "-n", NAMESPACE, "--subresource=status",
                "--type=merge", "-p", f'{{"status": {{"phase": "Running", "podIP": "{ip}"}}}}',
            )  # fmt: skip
        assert client.pod("swapped", 0)["metadata"]["name"] == "swapped-worker-1"
        assert client.pod("swapped", 1)["metadata"]["name"] == "swapped-worker-0"
        assert client.metrics("swapped").loss == 1.5
        with pytest.raises(ClientError, match="has no pod of node rank 2 now"):
            client.pod("swapped", 2)
    finally:
        for server in (first, second):
            server.shutdown()
            server.server_close()


def test_a_training_without_pods_says_where_it_stands(client: Client, api: TestCluster) -> None:
    client.submit(tiny("nopods"))
    set_status(api, "nopods", {"phase": "Queued", "message": "waiting for quota in ClusterQueue gpu"})
    with pytest.raises(ClientError, match=r"has no pod of node rank 0 now \(.*: Queued \| waiting for quota"):
        client.logs("nopods")


def test_export_creates_a_job_owned_by_the_training_and_refuses_what_cannot_be_exported(
    client: Client, api: TestCluster
) -> None:
    created = client.submit(tiny("exported", checkpoint={"claimName": "ckpt"}))
    job = client.export("exported", "s3://models/exported", wait=False)
    assert isinstance(job, str) and job.startswith("exported-export-")
    body = client.api.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{job}")
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("FSDPTraining", "exported", created.body["metadata"]["uid"])
    assert body["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "fsdp-train", "export", "--checkpoint", "/checkpoints",
    ]  # fmt: skip
    # No Job controller runs here: it never ends.
    with pytest.raises(WaitTimeout, match=f"export Job {NAMESPACE}/{job} did not finish within 0.5 s"):
        client.wait_export(job, timeout=0.5)

    client.submit(tiny("ephemeral"))
    with pytest.raises(ClientError, match=f"{NAMESPACE}/ephemeral: its checkpoints were in an emptyDir"):
        client.export("ephemeral", "s3://models/ephemeral")
    with pytest.raises(ClientError, match=r"--to: /tmp/model is not s3://bucket\[/prefix\]"):
        client.export("exported", "/tmp/model")
    with pytest.raises(ClientError, match="--memory: '64GB' is not a Kubernetes quantity"):
        client.export("exported", "s3://models/x", memory="64GB")
