"""A whole cluster on one machine, for the end-to-end tests and ``make demo-cluster``.

etcd + kube-apiserver (TestCluster), kube-scheduler + kube-controller-manager +
the Kubeflow training operator (ControlPlane), and Karpenter-shaped nodes whose
pods run as local processes (NodeAgent). ``install_operator()`` adds the
fsdp-operator exactly as a user would: ``kubectl apply -k kustomize/default``
(``operator_install``), its Deployment's pod then running on the system node
like any other pod.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .apiserver import TestCluster
from .control_plane import ControlPlane
from .images import LOCAL_IMAGE_PATTERN
from .node_agent import NodeAgent, NodeSpec, karpenter_node
from .node_agent.client import KubeAPI
from .node_agent.containers import image_mode_available
from .operator_install import OPERATOR_ENTRYPOINT, OPERATOR_NAMESPACE, install_operator
from .prometheus import PrometheusServer
from .resources import Resources
from .wait import wait_for

Obj = dict[str, Any]

# The ENTRYPOINTs of this repository's images (Dockerfile), for containers that
# only give args: the node agent runs them from the virtualenv.
IMAGE_COMMANDS = {
    "ghcr.io/fsdp-k8s/operator*": list(OPERATOR_ENTRYPOINT),
    "ghcr.io/fsdp-k8s/trainer*": ["torchrun"],
}
# Ports some pods bind on every interface (the rendezvous store, C++ code the
# agent cannot redirect to the pod's address) are machine-wide: one whole
# cluster per machine at a time.
MACHINE_LOCK = Path(os.environ.get("FSDP_WHOLE_CLUSTER_LOCK", "/tmp/fsdp-k8s-whole-cluster.lock"))


# The GPU nodes' EKS network layers, broadest first (default_nodes).
NETWORK_LAYERS = {"gpu-0": ("nn-top", "nn-mid", "nn-a"), "gpu-1": ("nn-top", "nn-mid", "nn-b")}


def default_nodes() -> list[NodeSpec]:
    """A system node (untainted, NodePool "default") and two p5.48xlarge GPU nodes (NodePool "gpu").

    The GPU nodes share the network's upper two layers and each has a bottom (layer 3) domain of
    its own, as EKS labels them: room for a two-node training in one layer-2 domain, none in one
    layer-3 domain.
    """
    return [
        karpenter_node(
            "system-0", node_pool="default", instance_type="m7i.2xlarge", gpus=0, efa=0, cpu="8", memory="32Gi"
        ),
        *(
            karpenter_node(name, node_pool="gpu", instance_type="p5.48xlarge", zone="us-west-2a", network_layers=layers)
            for name, layers in NETWORK_LAYERS.items()
        ),
    ]


@contextlib.contextmanager
def machine_lock(timeout: float = 1800.0) -> Iterator[None]:
    """Hold the machine-wide whole-cluster lock (bounded wait)."""
    MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with MACHINE_LOCK.open("a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another whole cluster holds {MACHINE_LOCK} for over {timeout:.0f}s") from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class WholeCluster:
    """Every component of a cluster, on loopback; ``timings`` records how long each phase took."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec] | None = None,
        echo_logs: Callable[[str], None] | None = None,
    ) -> None:
        self.cluster = TestCluster()
        self.control_plane = ControlPlane(self.cluster)
        self.nodes = list(nodes or default_nodes())
        self.echo_logs = echo_logs
        self.agent: NodeAgent | None = None
        self._resources: Resources | None = None
        self.timings: dict[str, float] = {}

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> WholeCluster:
        try:
            t = time.monotonic()
            self.cluster.start()
            self.timings["apiserver_etcd_start_s"] = time.monotonic() - t
            t = time.monotonic()
            self.control_plane.start()
            self.timings["control_plane_start_s"] = time.monotonic() - t
            t = time.monotonic()
            self.agent = NodeAgent(
                self.cluster.kubeconfig,
                self.nodes,
                image_commands=IMAGE_COMMANDS,
                # Pods naming an image `make images` built run from it in a container (where podman can).
                image_patterns=[LOCAL_IMAGE_PATTERN] if image_mode_available() else [],
                restart_backoff=(1.0, 5.0),
                echo_logs=self.echo_logs,
            ).start()
            names = [n.name for n in self.nodes]
            wait_for(lambda: self._nodes_ready(names), 60, f"nodes {names} Ready")
            self.timings["nodes_ready_s"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._resources = None
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        self.control_plane.stop()
        self.cluster.stop()

    def __enter__(self) -> WholeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def node_agent(self) -> NodeAgent:
        assert self.agent is not None, "the whole cluster is not started"
        return self.agent

    # --- kubectl helpers ------------------------------------------------------

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, **kwargs)

    @property
    def resources(self) -> Resources:
        """Objects by kubectl's resource names, over one keep-alive connection (the tests poll with it)."""
        if self._resources is None:
            self._resources = Resources(KubeAPI(self.cluster.kubeconfig, self.cluster.workdir / "test-client"))
        return self._resources

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        """One object as a dict, or None when it does not exist."""
        return self.resources.get(kind, name, namespace)

    def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[Obj]:
        """Every object of a kind, in a namespace or (None) in all of them."""
        return self.resources.list(kind, namespace, selector)

    def _nodes_ready(self, names: Sequence[str]) -> bool:
        ready = {
            n["metadata"]["name"]
            for n in self.list("nodes")
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        }
        return set(names) <= ready

    def describe(self, namespace: str) -> str:
        """Pods, jobs and events of a namespace, for failure messages."""
        out = self.kubectl(
            "get", "fsdptrainings,pytorchjobs,pods,pvc", f"--namespace={namespace}", "-o", "wide", check=False
        )
        events = self.kubectl("get", "events", f"--namespace={namespace}", "--sort-by=.lastTimestamp", check=False)
        return f"{out.stdout}{out.stderr}\n{events.stdout[-4000:]}"

    # --- the operator -----------------------------------------------------------

    def install_operator(
        self, timeout: float = 180.0, env: Mapping[str, str] | None = None, *, clusterwide: bool = False
    ) -> float:
        """``kubectl apply -k kustomize/default`` (or overlays/clusterwide); wait for the operator pod; returns seconds.

        ``env`` overrides variables of the operator container (e.g. a shorter
        metrics scrape interval, so that short test runs show progress).
        """
        t = time.monotonic()
        install_operator(self.cluster, OPERATOR_NAMESPACE, deploy=True, env=env, clusterwide=clusterwide)
        self.wait_operator_ready(timeout)
        took = time.monotonic() - t
        self.timings["operator_install_s"] = took
        return took

    def operator_pod(self) -> Obj | None:
        pods = [
            p
            for p in self.list("pods", OPERATOR_NAMESPACE, "app.kubernetes.io/name=fsdp-operator")
            if not p["metadata"].get("deletionTimestamp")
        ]
        return pods[0] if pods else None

    def wait_operator_ready(self, timeout: float = 180.0) -> Obj:
        def ready() -> Obj | None:
            pod = self.operator_pod()
            conds = {c["type"]: c["status"] for c in ((pod or {}).get("status") or {}).get("conditions", [])}
            return pod if conds.get("Ready") == "True" else None

        return wait_for(ready, timeout, "the fsdp-operator pod to be Ready")

    def operator_logs(self) -> str:
        pod = self.operator_pod()
        if pod is None:
            return "(no operator pod)"
        return self.node_agent.logs(OPERATOR_NAMESPACE, pod["metadata"]["name"])

    # --- Prometheus -------------------------------------------------------------

    def prometheus_for(self, pod_monitor: Mapping[str, Any], scrape_interval: str = "1s") -> PodMonitorPrometheus:
        """A real Prometheus scraping the pods ``pod_monitor`` selects (not started)."""
        return PodMonitorPrometheus(self.cluster, pod_monitor, scrape_interval)


class PodMonitorPrometheus(PrometheusServer):
    """Prometheus scraping what a PodMonitor selects, as prometheus-operator would set it up.

    Debian's Prometheus is built without Kubernetes service discovery, so this
    class does the discovery: a thread lists the pods every second and writes
    the ones the PodMonitor selects (labels, container port by name, not
    finished) to a ``file_sd`` file, with ``namespace``/``pod``/``node``
    labels. Prometheus then scrapes their pod IPs as in a cluster.
    """

    def __init__(self, cluster: TestCluster, pod_monitor: Mapping[str, Any], scrape_interval: str = "1s") -> None:
        super().__init__([], scrape_interval=scrape_interval)
        self.cluster = cluster
        self.pod_monitor = pod_monitor
        self._targets_dir: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        assert self.workdir is not None
        self._targets_dir = self.workdir
        self._discover()
        meta, spec = self.pod_monitor["metadata"], self.pod_monitor["spec"]
        cfg["scrape_configs"] = [
            {
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
                "metrics_path": endpoint.get("path", "/metrics"),
                "file_sd_configs": [
                    {"files": [str(self._targets_dir / f"targets-{i}.json")], "refresh_interval": "1s"}
                ],
            }
            for i, endpoint in enumerate(spec["podMetricsEndpoints"])
        ]
        return cfg

    def start(self, timeout: float = 60.0) -> PodMonitorPrometheus:
        super().start(timeout)
        self._thread = threading.Thread(target=self._discovery_loop, name="podmonitor-discovery", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        super().stop()

    def _discovery_loop(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):  # a failed listing keeps the previous targets
                self._discover()

    def _discover(self) -> None:
        meta, spec = self.pod_monitor["metadata"], self.pod_monitor["spec"]
        selector = ",".join(f"{k}={v}" for k, v in spec["selector"].get("matchLabels", {}).items())
        out = self.cluster.kubectl(
            "get", "pods", f"--namespace={meta['namespace']}", f"--selector={selector}", "-o", "json"
        )
        pods = json.loads(out.stdout)["items"]
        assert self._targets_dir is not None
        for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
            groups = []
            for pod in pods:
                st = pod.get("status") or {}
                if st.get("phase") in ("Succeeded", "Failed") or not st.get("podIP"):
                    continue
                ports = [
                    p["containerPort"]
                    for c in pod["spec"]["containers"]
                    for p in c.get("ports", [])
                    if p.get("name") == endpoint["port"]
                ]
                labels = {
                    "namespace": meta["namespace"],
                    "pod": pod["metadata"]["name"],
                    "node": pod["spec"].get("nodeName", ""),
                }
                groups += [{"targets": [f"{st['podIP']}:{port}"], "labels": labels} for port in ports]
            path = self._targets_dir / f"targets-{i}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(groups))
            tmp.replace(path)  # Prometheus must never read a half-written file
