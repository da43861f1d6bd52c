"""The node agent's translation rules, without a cluster (part of the fast suite).

These are the places where the agent stands in for a container runtime and
cluster DNS, so their semantics are pinned here: kubelet-style ``$(VAR)``
expansion, mount-path and Service-name rewriting, the pod-network shim.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsdp_localcluster.node_agent import (
    POD_IP_ENV,
    SITECUSTOMIZE,
    PodNetwork,
    expand,
    karpenter_node,
    parse_quantity,
    rewrite_paths,
)


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


def test_pod_ips_are_stable_per_pod_name(tmp_path: Path) -> None:
    net = PodNetwork(tmp_path / "hosts")
    a, b = net.ip_for("ns", "a"), net.ip_for("ns", "b")
    assert a != b and net.ip_for("ns", "a") == a


def test_parse_quantity() -> None:
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("2Gi") == 2 * 2**30
    assert parse_quantity("8") == 8


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


def test_termination_message_is_the_kubelets_log_tail(tmp_path: Path) -> None:
    from fsdp_localcluster.node_agent.pods import TERMINATION_LOG_BYTES, log_tail

    log = tmp_path / "c.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    # The last 80 lines, cut to their last 2048 bytes (here they fit).
    assert log_tail(log) == "".join(f"line {i}\n" for i in range(20, 100))
    log.write_text("x" * 5000 + "\nfsdp-train: the end\n")
    tail = log_tail(log)
    assert len(tail.encode()) == TERMINATION_LOG_BYTES and tail.endswith("\nfsdp-train: the end\n")
    assert log_tail(tmp_path / "missing.log") == ""
