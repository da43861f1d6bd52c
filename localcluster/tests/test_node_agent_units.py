"""The node agent's translation rules, without a cluster (part of the fast suite).

These are the places where the agent stands in for a container runtime and
cluster DNS, so their semantics are pinned here: kubelet-style ``$(VAR)``
expansion, mount-path and Service-name rewriting, the pod-network shim.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from fsdp_localcluster.node_agent import (
    POD_IP_ENV,
    SITECUSTOMIZE,
    NotReady,
    PodContext,
    PodNetwork,
    PodWorker,
    expand,
    karpenter_node,
    rewrite_paths,
)
from fsdp_localcluster.node_agent.client import KubeAPI


def test_expand_follows_kubelet_rules() -> None:
    env = {"RANK": "1", "HOME": "/home/trainer"}
    assert expand("--rank=$(RANK)", env) == "--rank=1"
    assert expand("$(HOME)/.cache", env) == "/home/trainer/.cache"
    assert expand("$(UNDEFINED)", env) == "$(UNDEFINED)"  # left as written
    assert expand("$$(RANK) costs $$5", env) == "$(RANK) costs $5"  # $$ escapes


def test_rewrite_paths_maps_whole_path_components_only() -> None:
    mounts = [("/checkpoints", Path("/x/pvc")), ("/etc/fsdp", Path("/x/cm")), ("/tmp", Path("/x/tmp"))]
    assert rewrite_paths("--config /etc/fsdp/train.yaml", mounts) == "--config /x/cm/train.yaml"
    assert rewrite_paths("dir: /checkpoints\n", mounts) == "dir: /x/pvc\n"
    assert rewrite_paths("/checkpoints-old /var/tmp/a /tmpfoo", mounts) == "/checkpoints-old /var/tmp/a /tmpfoo"
    assert rewrite_paths("TMPDIR=/tmp", mounts) == "TMPDIR=/x/tmp"


def test_service_names_resolve_to_the_selected_pods_address(tmp_path: Path) -> None:
    net = PodNetwork(tmp_path / "hosts")
    pod = {
        "metadata": {"name": "job-worker-0", "namespace": "ns", "labels": {"replica-index": "0"}},
        "status": {"phase": "Running"},
    }
    svc = {"metadata": {"name": "job-worker-0", "namespace": "ns"}, "spec": {"selector": {"replica-index": "0"}}}
    net.refresh([svc], [pod])
    ip = net.ip_for("ns", "job-worker-0")
    assert ip.startswith("127.")
    assert net.rewrite("--rdzv-endpoint=job-worker-0:29400", "ns") == f"--rdzv-endpoint={ip}:29400"
    assert net.rewrite("http://job-worker-0.ns.svc.cluster.local:9402/metrics", "ns") == f"http://{ip}:9402/metrics"
    # Not a host name: inside another name, or a path component.
    assert net.rewrite("my-job-worker-0 /data/job-worker-0", "ns") == "my-job-worker-0 /data/job-worker-0"
    # Short names are namespace-local, as in cluster DNS.
    assert net.rewrite("job-worker-0:29400", "other") == "job-worker-0:29400"
    assert f"{ip} job-worker-0.ns.svc" in (tmp_path / "hosts").read_text()


def jobset_pod(name: str, hostname: str, subdomain: str = "tj", phase: str = "Running") -> dict[str, Any]:
    """A pod as JobSet's Indexed Jobs make it: random name suffix, hostname and subdomain."""
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": {"jobset.sigs.k8s.io/jobset-name": "tj"},
            "annotations": {"batch.kubernetes.io/job-completion-index": hostname.rsplit("-", 1)[1]},
        },
        "spec": {"hostname": hostname, "subdomain": subdomain, "nodeName": "n", "containers": [{"name": "node"}]},
        "status": {"phase": phase},
    }


def headless_service(name: str = "tj", cluster_ip: str = "None") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterIP": cluster_ip, "selector": {"jobset.sigs.k8s.io/jobset-name": "tj"}},
    }


def test_hostname_subdomain_names_resolve_to_their_pod(tmp_path: Path) -> None:
    """A headless Service's pods with spec.hostname/subdomain get cluster DNS's per-pod names."""
    net = PodNetwork(tmp_path / "hosts")
    pods = [jobset_pod("tj-node-0-0-x7k2p", "tj-node-0-0"), jobset_pod("tj-node-0-1-m4q9z", "tj-node-0-1")]
    net.refresh([headless_service()], pods)
    ip0, ip1 = net.ip_for("ns", "tj-node-0-0-x7k2p"), net.ip_for("ns", "tj-node-0-1-m4q9z")
    assert ip0 != ip1
    assert net.rewrite("PET_MASTER_ADDR=tj-node-0-0.tj", "ns") == f"PET_MASTER_ADDR={ip0}"
    assert net.rewrite("tj-node-0-1.tj:29400", "ns") == f"{ip1}:29400"
    assert net.rewrite("tj-node-0-1.tj.ns.svc", "ns") == ip1
    assert net.rewrite("http://tj-node-0-0.tj.ns.svc.cluster.local:8080/", "ns") == f"http://{ip0}:8080/"
    # The short form is namespace-local; the qualified ones resolve anywhere.
    assert net.rewrite("tj-node-0-0.tj", "other") == "tj-node-0-0.tj"
    assert net.rewrite("tj-node-0-0.tj.ns", "other") == ip0
    hosts = (tmp_path / "hosts").read_text()
    assert f"{ip1} tj-node-0-1.tj.ns.svc.cluster.local" in hosts
    # The Service's own name still resolves to its first pod.
    assert net.rewrite("tj.ns.svc", "ns") == ip0


def test_hostname_names_need_a_headless_service_named_by_the_subdomain(tmp_path: Path) -> None:
    net = PodNetwork(tmp_path / "hosts")
    pods = [
        jobset_pod("a-x", "tj-node-0-0"),
        jobset_pod("b-x", "tj-node-0-1", subdomain="elsewhere"),
        jobset_pod("c-x", "tj-node-0-2", phase="Succeeded"),  # finished pods leave the endpoints
    ]
    net.refresh([headless_service()], pods)
    names = net.names_for("ns")
    assert "tj-node-0-0.tj" in names
    assert not any(n.startswith(("tj-node-0-1.", "tj-node-0-2.")) for n in names)
    # A Service with a cluster IP has no per-pod records.
    net.refresh([headless_service(cluster_ip="10.96.0.10")], pods)
    assert "tj-node-0-0.tj" not in net.names_for("ns") and "tj" in net.names_for("ns")


def test_a_replaced_pod_keeps_its_hostname_and_gets_the_new_address(tmp_path: Path) -> None:
    net = PodNetwork(tmp_path / "hosts")
    old, new = jobset_pod("tj-node-0-0-aaaaa", "tj-node-0-0"), jobset_pod("tj-node-0-0-bbbbb", "tj-node-0-0")
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    net.refresh([headless_service()], [old, new])
    assert net.names_for("ns")["tj-node-0-0.tj"] == net.ip_for("ns", "tj-node-0-0-bbbbb")


def test_a_withheld_record_is_not_served_and_a_start_does_not_wait_for_it(tmp_path: Path) -> None:
    """A test's DNS outage: no record for one pod name, and a process naming it starts without it."""
    net = PodNetwork(tmp_path / "hosts")
    pods = [jobset_pod("tj-node-0-0-x7k2p", "tj-node-0-0")]
    net.withhold("ns", "tj-node-0-0.tj")
    net.refresh([headless_service()], pods)
    assert net.rewrite("tj-node-0-0.tj:29400", "ns") == "tj-node-0-0.tj:29400"
    assert "tj-node-0-0.tj" not in (tmp_path / "hosts").read_text()
    worker = pod_worker(tmp_path, pods[0], net, pods)
    worker._await_peer_names(worker.container(), ["--rdzv-endpoint=tj-node-0-0.tj:29400"])  # no NotReady
    net.withhold("ns", "tj-node-0-0.tj", withheld=False)
    net.refresh([headless_service()], pods)
    assert net.rewrite("tj-node-0-0.tj:29400", "ns") == f"{net.ip_for('ns', 'tj-node-0-0-x7k2p')}:29400"


def pod_worker(tmp_path: Path, pod: dict[str, Any], net: PodNetwork, peers: Sequence[dict[str, Any]]) -> PodWorker:
    """A PodWorker with no API server behind it: enough for its translation rules."""
    ctx = PodContext(
        api=cast(KubeAPI, None),  # never called by the translation rules
        network=net,
        pods_dir=tmp_path,
        agent_id="test",
        node_ip="127.0.0.1",
        node_capacity={},
        shim_dir=tmp_path,
        site_dir=tmp_path,
        bind_shim=None,
        extra_env={},
        image_commands={},
        restart_backoff=(1.0, 5.0),
        max_grace=1.0,
        stopping=threading.Event(),
        refresh_dns=lambda: None,
        pod_names=lambda ns: [p["metadata"]["name"] for p in peers if p["metadata"]["namespace"] == ns],
        pod_hostnames=lambda ns: [
            f"{p['spec']['hostname']}.{p['spec']['subdomain']}"
            for p in peers
            if p["metadata"]["namespace"] == ns and p["spec"].get("hostname")
        ],
    )
    return PodWorker(ctx, pod)


def test_a_start_waits_for_the_hostname_of_a_peer_pod(tmp_path: Path) -> None:
    """A command naming <hostname>.<subdomain> of a pod of its namespace waits until DNS has it."""
    net = PodNetwork(tmp_path / "hosts")
    pods = [jobset_pod("tj-node-0-0-x7k2p", "tj-node-0-0"), jobset_pod("tj-node-0-1-m4q9z", "tj-node-0-1")]
    worker = pod_worker(tmp_path, pods[1], net, pods)
    run = worker.container()
    net.refresh([], pods)  # the headless Service does not exist yet
    with pytest.raises(NotReady, match=r"tj-node-0-0\.tj"):
        worker._await_peer_names(run, ["python", "-c", "connect('tj-node-0-0.tj', 29400)"])
    worker._await_peer_names(run, ["python", "-c", "print('no peer named')"])  # nothing to wait for
    net.refresh([headless_service()], pods)
    worker._await_peer_names(run, ["python", "-c", "connect('tj-node-0-0.tj', 29400)"])


def test_a_start_waits_for_a_peer_under_its_subdomain_that_does_not_exist_yet(tmp_path: Path) -> None:
    """A Job creates its pods one by one: rank 1 may start before rank 0's pod exists."""
    net = PodNetwork(tmp_path / "hosts")
    rank1 = jobset_pod("tj-node-0-1-m4q9z", "tj-node-0-1")
    worker = pod_worker(tmp_path, rank1, net, [rank1])
    run = worker.container()
    net.refresh([headless_service()], [rank1])
    with pytest.raises(NotReady, match=r"tj-node-0-0\.tj"):
        worker._await_peer_names(run, ["PET_MASTER_ADDR=tj-node-0-0.tj"])
    worker._await_peer_names(run, ["tj-node-0-1.tj"])  # its own name resolves already
    worker._await_peer_names(run, ["x-0.other"])  # not under its subdomain: no peer of it
    rank0 = jobset_pod("tj-node-0-0-x7k2p", "tj-node-0-0")
    net.refresh([headless_service()], [rank0, rank1])
    worker._await_peer_names(run, ["PET_MASTER_ADDR=tj-node-0-0.tj"])


def test_a_start_waits_for_a_peer_service_whose_pod_is_being_replaced(tmp_path: Path) -> None:
    """After a stall restart, worker-1 may start while worker-0's old pod is still terminating.

    The training operator re-creates worker-0 only once the old pod is gone:
    meanwhile no live pod is named ``job-worker-0``, but its Service exists,
    and the start must wait for it rather than run with a name that resolves
    to nothing (the rendezvous then never finds its store).
    """
    net = PodNetwork(tmp_path / "hosts")

    def worker_pod(index: int, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"job-worker-{index}", "namespace": "ns", "uid": f"uid-{index}"}
        meta["labels"] = {"index": str(index)}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
        return {"metadata": meta, "spec": {"containers": [{"name": "pytorch"}]}, "status": {"phase": "Running"}}

    services = [
        {"metadata": {"name": f"job-worker-{i}", "namespace": "ns"}, "spec": {"selector": {"index": str(i)}}}
        for i in (0, 1)
    ]
    old0, new1 = worker_pod(0, deleting=True), worker_pod(1)
    worker = pod_worker(tmp_path, new1, net, [new1])  # the terminating pod is no live pod
    run = worker.container()
    net.refresh(services, [old0, new1])
    with pytest.raises(NotReady, match=r"job-worker-0"):
        worker._await_peer_names(run, ["torchrun", "--rdzv-endpoint=job-worker-0:29400"])
    net.refresh(services, [worker_pod(0), new1])  # worker-0 is back
    worker._await_peer_names(run, ["torchrun", "--rdzv-endpoint=job-worker-0:29400"])


def test_job_completion_index_annotation_as_a_field_ref(tmp_path: Path) -> None:
    """PET_NODE_RANK's source in Trainer v2 (constants.JobCompletionIndexFieldPath)."""
    net = PodNetwork(tmp_path / "hosts")
    pod = jobset_pod("tj-node-0-1-m4q9z", "tj-node-0-1")
    worker = pod_worker(tmp_path, pod, net, [pod])
    assert worker._field("metadata.annotations['batch.kubernetes.io/job-completion-index']") == "1"


def test_pod_ips_are_stable_per_pod_name(tmp_path: Path) -> None:
    net = PodNetwork(tmp_path / "hosts")
    a, b = net.ip_for("ns", "a"), net.ip_for("ns", "b")
    assert a != b and net.ip_for("ns", "a") == a


def test_karpenter_gpu_node_shape() -> None:
    node = karpenter_node("gpu-0")
    assert node.labels["karpenter.sh/nodepool"] == "gpu"
    assert node.capacity["nvidia.com/gpu"] == "8" and node.capacity["vpc.amazonaws.com/efa"] == "32"
    assert node.taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    cpu = karpenter_node("sys", node_pool="default", instance_type="m7i.2xlarge", gpus=0, efa=0)
    assert cpu.taints == [] and "nvidia.com/gpu" not in cpu.capacity


def test_sitecustomize_gives_python_processes_their_pod_address(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    code = (
        "import socket\n"
        "s = socket.socket(); s.bind(('0.0.0.0', 0)); print(s.getsockname()[0])\n"
        "print(socket.getfqdn())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), POD_IP_ENV: "127.77.0.9"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["127.77.0.9", "127.77.0.9"]


# Two pods' rendezvous hosts on one port, as torch elastic starts them (TCPStore binds *:port in C++).
_STORE_HOST = """
import datetime, os, sys, time
import torch.distributed as dist
ip, port = os.environ["@IP@"], int(sys.argv[1])
try:
    store = dist.TCPStore(ip, port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
except Exception as e:
    print("bind failed:", type(e).__name__, flush=True)
    sys.exit(3)
store.set("owner", ip)
print("serving", flush=True)
time.sleep(60)
"""


@pytest.mark.slow  # builds the bind shim with the C compiler (over the unit tier's limit, tests/slow_guard.py)
def test_native_wildcard_binds_land_on_the_pods_address(tmp_path: Path) -> None:
    """Issue 23: the second pod's TCPStore found *:29400 taken and torch elastic used the first pod's store."""
    import datetime
    import socket

    import torch.distributed as dist
    from fsdp_localcluster.node_agent import bind_shim

    library = bind_shim.build(tmp_path / "lib")
    assert library is not None and library.is_file()
    assert bind_shim.build(tmp_path / "lib") == library  # built once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = _STORE_HOST.replace("@IP@", POD_IP_ENV)

    def host(ip: str, preload: bool) -> tuple[subprocess.Popen[str], str]:
        env = {**os.environ, POD_IP_ENV: ip, **({"LD_PRELOAD": str(library)} if preload else {})}
        proc = subprocess.Popen([sys.executable, "-c", code, str(port)], env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        return proc, proc.stdout.readline().strip()

    hosts = [host("127.77.0.1", True), host("127.77.0.2", True)]
    try:
        assert [said for _, said in hosts] == ["serving", "serving"]
        for ip in ("127.77.0.1", "127.77.0.2"):
            client = dist.TCPStore(ip, port, is_master=False, timeout=datetime.timedelta(seconds=5))
            assert client.get("owner").decode() == ip  # each pod's own store
        # Without the library a host binds *:port, which the others' addresses already hold
        # (torch elastic then falls back to being a client of whichever store answers).
        bare, said = host("127.77.0.3", False)
        assert said.startswith("bind failed"), said
        assert bare.wait(timeout=30) == 3
    finally:
        for proc, _ in hosts:
            proc.kill()
            proc.wait()


def test_termination_message_is_the_kubelets_log_tail(tmp_path: Path) -> None:
    from fsdp_localcluster.node_agent.runs import TERMINATION_LOG_BYTES, log_tail

    log = tmp_path / "c.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    # The last 80 lines, cut to their last 2048 bytes (here they fit).
    assert log_tail(log) == "".join(f"line {i}\n" for i in range(20, 100))
    log.write_text("x" * 5000 + "\nfsdp-train: the end\n")
    tail = log_tail(log)
    assert len(tail.encode()) == TERMINATION_LOG_BYTES and tail.endswith("\nfsdp-train: the end\n")
    assert log_tail(tmp_path / "missing.log") == ""


def test_image_mode_passes_the_pods_security_mounts_and_limits_to_podman(tmp_path: Path) -> None:
    from fsdp_localcluster.node_agent.containers import ContainerLaunch

    launch = ContainerLaunch(
        name="c1",
        image="localhost/fsdp-k8s/trainer:local",
        command=["python"],
        args=["-m", "fsdp_trainer"],
        env={"A": "1 2"},
        mounts=[("/etc/fsdp", tmp_path / "cfg", True), ("/checkpoints", tmp_path / "ck", False)],
        hostname="job-worker-0",
        pod_ip="127.9.0.3",
        working_dir=None,
        security={
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 2000,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        },
        limits={"cpu": "100000", "memory": "512Mi", "nvidia.com/gpu": "1"},
    )
    argv = launch.argv(tmp_path / "runc")
    joined = " ".join(argv)
    assert argv[:3] == ["podman", "--runtime", str(tmp_path / "runc")]
    assert "--user 1000:1000" in joined and "--group-add 2000" in joined
    assert "--read-only" in argv and "--read-only-tmpfs=false" in argv
    assert "--cap-drop=ALL" in argv and "--cap-add=IPC_LOCK" in argv
    assert "--security-opt no-new-privileges" in joined
    assert f"type=bind,src={tmp_path / 'cfg'},dst=/etc/fsdp,ro=true" in argv
    assert f"type=bind,src={tmp_path / 'ck'},dst=/checkpoints" in argv
    assert "--add-host job-worker-0:127.9.0.3" in joined and "--network=host" in argv
    # CPU capped at this machine's; memory as bytes, with no swap beyond it.
    assert f"--cpus {float(os.cpu_count() or 1):.2f}" in joined
    assert "--memory 536870912 --memory-swap 536870912" in joined
    # command replaces the ENTRYPOINT, args follow the image.
    i = argv.index("--entrypoint")
    assert argv[i + 1] == '["python"]' and argv[i + 2 :] == ["localhost/fsdp-k8s/trainer:local", "-m", "fsdp_trainer"]
    assert "--env" in argv and "A=1 2" in argv


def test_image_mode_without_a_read_only_root_or_user_leaves_the_images_own() -> None:
    from fsdp_localcluster.node_agent.containers import ContainerLaunch

    argv = ContainerLaunch(
        name="c2",
        image="img",
        command=None,
        args=None,
        env={},
        mounts=[],
        hostname="h",
        pod_ip="127.0.0.1",
        working_dir="/w",
        security={},
        limits={},
    ).argv(Path("/r"))
    assert "--read-only" not in argv and "--user" not in argv and "--entrypoint" not in argv
    assert argv[-1] == "img" and "--workdir" in argv


def test_a_pod_deleted_while_the_watch_reconnects_is_stopped_without_a_deadlock() -> None:
    """The relist after a watch ends found a pod gone and called _on_delete under the lock it takes:
    the agent hung, and every test after it waited on that lock (seen in a full run, 2026-11-26)."""
    import threading

    from fsdp_localcluster.node_agent.agent import NodeAgent

    stopped: list[str] = []

    class Worker:
        def mark_gone(self) -> None:
            stopped.append("gone")

    class Api:
        def get(self, path: str) -> dict:
            return {"items": [], "metadata": {"resourceVersion": "7"}}  # the pod is gone

        def watch(self, path: str, rv: str, stopping: threading.Event):
            stopping.set()  # one relist is all this test needs
            return iter(())

    agent = object.__new__(NodeAgent)
    agent.stopping, agent.api, agent._lock = threading.Event(), Api(), threading.Lock()
    agent.pods = {"u1": {"metadata": {"uid": "u1", "name": "p", "namespace": "ns"}}}
    agent.workers = {"u1": Worker()}
    loop = threading.Thread(target=agent._watch_loop, daemon=True)
    loop.start()
    loop.join(10)
    assert not loop.is_alive(), "the pod watch deadlocked on its own lock"
    assert stopped == ["gone"] and agent.pods == {}
