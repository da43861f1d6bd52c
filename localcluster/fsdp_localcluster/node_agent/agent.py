"""A local node agent: the kubelet of the local cluster, running pods as local processes.

It registers Node objects shaped like Karpenter-provisioned EC2 nodes (GPU and
EFA capacity, NodePool / instance-type / capacity-type labels, the GPU taint),
keeps them alive (a Lease in ``kube-node-lease`` every 10 s, the Ready
condition), and for every pod the scheduler binds to one of them:

- runs its init containers, then its containers, as local processes with the
  pod's environment (``env``, ``envFrom``, the downward API, ``$(VAR)``
  expansion, service-account credentials), streaming their output to log
  files that ``kubectl logs`` reads through the agent's kubelet endpoint;
- reports phase, conditions and container states (running / terminated with
  exit code, restart counts) through the ``pods/status`` subresource;
- restarts containers per ``restartPolicy`` (``Always``/``OnFailure`` in
  place with a short back-off, ``Never``: the pod fails);
- on deletion sends SIGTERM, waits the grace period, SIGKILLs what is left and
  removes the pod, as a kubelet does;
- provisions a hostPath PersistentVolume for each pending claim (a folder that
  outlives the pods, e.g. for checkpoints).

What a container runtime would isolate is emulated, and the emulation has to
touch the command line and environment (documented in docs/e2e.md):

- **Images** are ignored. The command runs on this machine; an executable that
  this repository's virtualenv provides (``python``, ``torchrun``,
  ``fsdp-operator``...) is taken from there. An image without ``command`` needs
  an entry in ``image_commands`` (its ENTRYPOINT).
- **Network**: each pod gets its own loopback address (``127.N.x.y``), which
  it reports as ``podIP``. Service names (``svc``, ``svc.ns``, ``svc.ns.svc``,
  ``...cluster.local``) in arguments and environment values are replaced by
  the IP of the pod the Service selects; an ``nslookup`` shim answers from the
  same table. Python processes bind wildcard addresses to their pod IP (a
  ``sitecustomize`` shim), so two pods can serve the same port.
- **Filesystem**: each volume is a local folder; mount paths in arguments,
  environment values and files projected from ConfigMaps/Secrets are rewritten
  to those folders (``/checkpoints`` -> ``<pvc folder>``); a ``/tmp`` mount
  becomes ``TMPDIR``.
- **Service account**: when the token is automounted, the agent requests one
  (TokenRequest API), writes the usual ``token``/``ca.crt``/``namespace`` files
  and points ``KUBECONFIG`` at a kubeconfig using it; ``KUBERNETES_SERVICE_HOST``
  and ``_PORT`` name the real API server.
- ``securityContext`` (users, capabilities, read-only root) and resource limits
  are not enforced; probes are not run (a running container is ready).

This module registers the nodes and dispatches pods; the rest lives next to it:
``pods.py`` (one pod's lifecycle), ``network.py`` (pod IPs, DNS, the Python
shim), ``client.py`` (the API client). docs/e2e.md describes the whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fsdp_api.contract import EKS_NETWORK_LAYER_LABEL

from . import bind_shim
from .client import ApiError, KubeAPI, Obj, now, now_micro
from .containers import ServiceProxy, write_runtime
from .network import NSLOOKUP, SITECUSTOMIZE, PodNetwork
from .pod_sources import claim_path
from .pods import PodContext, PodWorker
from .runs import container_pids

log = logging.getLogger("node-agent")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
LEASE_RENEW_SECONDS = 10
NODE_STATUS_SECONDS = 30
PROVISIONER = "fsdp-k8s.dev/node-agent"


def default_workdir_root() -> Path:
    """Where agents keep pod folders: outside /tmp, which pods commonly mount (paths get rewritten)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdp-k8s" / "node-agents"
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass
class NodeSpec:
    """What one registered node looks like to the scheduler."""

    name: str
    labels: dict[str, str]
    capacity: dict[str, str]
    taints: list[Obj] = field(default_factory=list)
    provider_id: str | None = None


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def karpenter_node(
    name: str,
    *,
    node_pool: str = "gpu",
    instance_type: str = "p5.48xlarge",
    capacity_type: str = "on-demand",
    zone: str = "us-west-2a",
    gpus: int = 8,
    efa: int = 32,
    cpu: str = "192",
    memory: str = "2048Gi",
    pods: int = 100,
    gpu_name: str = "h100",
    taints: Sequence[Obj] | None = None,
    network_layers: Sequence[str] = (),
) -> NodeSpec:
    """A node as Karpenter registers it for ``node_pool`` (defaults: a p5.48xlarge GPU node).

    GPU nodes carry the ``nvidia.com/gpu`` NoSchedule taint unless ``taints`` says otherwise.
    ``network_layers``: the node's place in the AWS network, broadest first, as EKS labels it.
    """
    family, _, size = instance_type.partition(".")
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": zone[:-1],
        "karpenter.sh/nodepool": node_pool,
        "karpenter.sh/capacity-type": capacity_type,
        "karpenter.sh/registered": "true",
        "karpenter.sh/initialized": "true",
        "karpenter.k8s.aws/instance-family": family,
        "karpenter.k8s.aws/instance-size": size,
        "karpenter.k8s.aws/instance-cpu": cpu,
    }
    labels |= {EKS_NETWORK_LAYER_LABEL.format(n): domain for n, domain in enumerate(network_layers, start=1)}
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "1000Gi"}
    if gpus:
        labels |= {
            "karpenter.k8s.aws/instance-gpu-count": str(gpus),
            "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
            "karpenter.k8s.aws/instance-gpu-name": gpu_name,
        }
        capacity["nvidia.com/gpu"] = str(gpus)
    if efa:
        capacity["vpc.amazonaws.com/efa"] = str(efa)
    if taints is None:
        taints = [GPU_TAINT] if gpus else []
    instance_id = "i-" + uuid.uuid5(uuid.NAMESPACE_DNS, name).hex[:17]
    return NodeSpec(name, labels, capacity, list(taints), provider_id=f"aws:///{zone}/{instance_id}")


class _KubeletHandler(BaseHTTPRequestHandler):
    """``/containerLogs/<ns>/<pod>/<container>``: what ``kubectl logs`` asks the kubelet for."""

    agent: NodeAgent

    def log_message(self, format: str, *args: Any) -> None:  # the API server polls; stay quiet
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        if url.path in ("/healthz", "/readyz", "/livez"):
            self._reply(200, b"ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._reply(404, f"{url.path}: not served by the node agent (only logs are)\n".encode())
            return
        worker = self.agent.find_worker(parts[1], parts[2])
        try:
            c = worker.container(parts[3]) if worker else None
        except StopIteration:
            c = None
        if worker is None or c is None:
            self._reply(404, f"container {parts[3]!r} of pod {parts[1]}/{parts[2]} not found\n".encode())
            return
        previous = query.get("previous", ["false"])[0] == "true"
        attempt = c.attempts - 1 if previous else c.attempts
        path = c.log_path(attempt)
        if attempt < 1 or not path.exists():
            if previous:
                msg = f"previous terminated container {c.name!r} in pod {parts[2]!r} not found"
            else:
                msg = f"container {c.name!r} in pod {parts[2]!r} is waiting to start"
            self._reply(400, f"{msg}\n".encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        data = path.read_bytes()
        tail = query.get("tailLines", [None])[0]
        if tail is not None:
            data = b"".join(data.splitlines(keepends=True)[-int(tail) :])
        self.wfile.write(data)
        if query.get("follow", ["false"])[0] != "true" or previous:
            return
        offset = path.stat().st_size
        with contextlib.suppress(OSError), path.open("rb") as f:
            f.seek(offset)
            while True:
                # Whether it ended is read before the file: what it wrote before it ended is then sent
                # by this read, not lost between an empty read and the check.
                ended = c.attempts != attempt or not c.running or self.agent.stopping.is_set()
                chunk = f.read(65536)
                if chunk:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                elif ended:
                    return
                else:
                    time.sleep(0.2)

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class NodeAgent:
    """Registers ``nodes`` and runs the pods bound to them as local processes."""

    def __init__(
        self,
        kubeconfig: Path | str,
        nodes: Sequence[NodeSpec],
        workdir: Path | str | None = None,
        *,
        image_commands: Mapping[str, Sequence[str]] | None = None,
        image_patterns: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        restart_backoff: tuple[float, float] = (1.0, 10.0),
        max_grace: float = 30.0,
        echo_logs: Callable[[str], None] | None = None,
    ) -> None:
        """``image_commands``: fnmatch pattern of an image -> its ENTRYPOINT, for containers without ``command``.

        ``image_patterns``: fnmatch patterns of images whose containers run from
        the image itself, with podman (image mode, ``containers``); every other
        container runs as a local process.
        ``extra_env``: variables every container gets (before its own).
        ``restart_backoff``: (first, max) seconds between container restarts.
        ``max_grace``: cap on termination grace periods, in seconds.
        """
        self.id = uuid.uuid4().hex[:8]
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="node-agent-", dir=default_workdir_root()))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api = KubeAPI(Path(kubeconfig), self.workdir / "client")
        self.nodes = {n.name: n for n in nodes}
        self.node_ip = "127.0.0.1"
        self.image_commands = dict(image_commands or {})
        self.image_patterns = tuple(image_patterns)
        # Written now, so that a machine without podman/runc fails here, with one line.
        runtime = write_runtime(self.workdir / "runtime") if self.image_patterns else None
        self.network = PodNetwork(self.workdir / "hosts")
        self.service_proxy: ServiceProxy | None = None
        if runtime is not None:
            api = urllib.parse.urlsplit(self.api.server)
            self.service_proxy = ServiceProxy(
                f"{self.network.prefix}.255.1", (api.hostname or "127.0.0.1", api.port or 443)
            )
        self.extra_env = dict(extra_env or {})
        self.restart_backoff = restart_backoff
        self.max_grace = max_grace
        self.echo_logs = echo_logs
        self.shim_dir = self.workdir / "bin"
        self.site_dir = self.workdir / "site"
        self.storage = self.workdir / "volumes"
        self.stopping = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.pods: dict[str, Obj] = {}  # every pod in the cluster, by uid (for DNS)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._server: ThreadingHTTPServer | None = None
        self._echo_offsets: dict[Path, int] = {}
        self.kubelet_port = 0
        self._started = now()
        self._version = ""
        self._pod_context = PodContext(
            api=self.api,
            network=self.network,
            pods_dir=self.workdir / "pods",
            agent_id=self.id,
            node_ip=self.node_ip,
            node_capacity={n.name: n.capacity for n in self.nodes.values()},
            shim_dir=self.shim_dir,
            site_dir=self.site_dir,
            bind_shim=bind_shim.build(self.workdir / "lib"),
            extra_env=self.extra_env,
            image_commands=self.image_commands,
            image_patterns=self.image_patterns,
            runtime=runtime,
            api_server_ip=self.service_proxy.ip if self.service_proxy else None,
            restart_backoff=self.restart_backoff,
            max_grace=self.max_grace,
            stopping=self.stopping,
            refresh_dns=self.refresh_dns,
            pod_names=self.pod_names,
            pod_hostnames=self.pod_hostnames,
        )

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> NodeAgent:
        self.shim_dir.mkdir(parents=True, exist_ok=True)
        self.site_dir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        (self.site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        nslookup = self.shim_dir / "nslookup"
        nslookup.write_text(NSLOOKUP.replace("{hosts}", str(self.network.hosts_file)))
        nslookup.chmod(0o755)
        self.network.refresh([], [])
        self._start_kubelet_server()
        for node in self.nodes.values():
            self._register(node)
        for target, name in (
            (self._heartbeat_loop, "heartbeat"),
            (self._watch_loop, "pod-watch"),
            (self._housekeeping_loop, "housekeeping"),
        ):
            t = threading.Thread(target=target, name=f"node-agent-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, delete_nodes: bool = False, keep_workdir: bool = False) -> None:
        """Kill every pod process (SIGTERM, then SIGKILL after 5 s) and stop the agent's threads."""
        self.stopping.set()
        if self.service_proxy is not None:
            self.service_proxy.close()
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            for c in w.init_containers + w.containers:
                c.signal_main(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while any(c.running for w in workers for c in w.containers) and time.monotonic() < deadline:
            time.sleep(0.1)
        for w in workers:
            w.kill_all()
        self.api.close_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)
        for w in workers:
            w.join(timeout=5)
        if delete_nodes:
            for name in self.nodes:
                with contextlib.suppress(ApiError, OSError):
                    self.api.request("DELETE", f"/api/v1/nodes/{name}")
        if not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- nodes -------------------------------------------------------------------------

    def _start_kubelet_server(self) -> None:
        cert, key = self.workdir / "kubelet.crt", self.workdir / "kubelet.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "365",
                "-subj",
                "/CN=fsdp-node-agent",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
        )
        handler = type("Handler", (_KubeletHandler,), {"agent": self})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.kubelet_port = server.server_address[1]
        t = threading.Thread(target=server.serve_forever, name="node-agent-kubelet", daemon=True)
        t.start()
        self._threads.append(t)

    def _node_status(self, node: NodeSpec) -> Obj:
        t = now()
        conditions = [
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID"},
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "local node agent is posting ready status",
            },
        ]
        for c in conditions:
            c |= {"lastHeartbeatTime": t, "lastTransitionTime": self._started}
        return {
            "capacity": node.capacity,
            "allocatable": node.capacity,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": self.node_ip}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": {
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, node.name).hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, node.name)),
                "bootID": self.id,
                "kernelVersion": platform.release(),
                "osImage": "fsdp-k8s local node agent",
                "containerRuntimeVersion": "local-process://1",
                "kubeletVersion": self._version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register(self, node: NodeSpec) -> None:
        self._version = self._version or self.api.get("/version")["gitVersion"]
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": node.labels},
            "spec": {"taints": node.taints, **({"providerID": node.provider_id} if node.provider_id else {})},
        }
        try:
            self.api.request("POST", "/api/v1/nodes", body)
        except ApiError as e:
            if e.status != 409:
                raise
            self.api.merge_patch(
                f"/api/v1/nodes/{node.name}", {"metadata": {"labels": node.labels}, "spec": body["spec"]}
            )
        self.api.merge_patch(f"/api/v1/nodes/{node.name}/status", {"status": self._node_status(node)})
        self._renew_lease(node.name)
        log.info("registered node %s (%s)", node.name, node.labels.get("node.kubernetes.io/instance-type"))

    def _renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()}
        try:
            self.api.merge_patch(path, {"spec": spec})
        except ApiError as e:
            if e.status != 404:
                raise
            node = self.api.get(f"/api/v1/nodes/{name}")
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
                "spec": spec,
            }
            self.api.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", lease)

    def _heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW_SECONDS):
            for node in self.nodes.values():
                try:
                    if self.api.get_or_none(f"/api/v1/nodes/{node.name}") is None:
                        self._register(node)  # deleted under us: register again, like a kubelet
                        continue
                    self._renew_lease(node.name)
                    if time.monotonic() - last_status >= NODE_STATUS_SECONDS:
                        self.api.merge_patch(f"/api/v1/nodes/{node.name}/status", {"status": self._node_status(node)})
                except (ApiError, OSError) as e:
                    log.warning("heartbeat of %s failed: %s", node.name, e)
            if time.monotonic() - last_status >= NODE_STATUS_SECONDS:
                last_status = time.monotonic()

    # --- pods ---------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                listing = self.api.get("/api/v1/pods")
                seen = {p["metadata"]["uid"]: p for p in listing["items"]}
                with self._lock:
                    gone = [self.pods[uid] for uid in set(self.pods) - set(seen)]
                    self.pods = {}
                # Outside the lock, which _on_delete takes: a pod deleted while the watch was
                # being re-established deadlocked the agent here (every later test waited on it).
                for pod in gone:
                    self._on_delete(pod)
                for pod in seen.values():
                    self._on_pod(pod)
                rv = listing["metadata"]["resourceVersion"]
                for event in self.api.watch("/api/v1/pods", rv, self.stopping):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    if event["type"] == "BOOKMARK":
                        continue
                    if event["type"] == "DELETED":
                        self._on_delete(obj)
                    else:
                        self._on_pod(obj)
            except Exception as e:
                if not self.stopping.is_set():
                    log.warning("pod watch: %s; retrying", e)
                    time.sleep(1)

    def _on_pod(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            self.pods[uid] = pod
            if pod["spec"].get("nodeName") not in self.nodes:
                return
            worker = self.workers.get(uid)
            if worker is not None:
                worker.update(pod)
                return
            finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if finished and not pod["metadata"].get("deletionTimestamp"):
                return  # done before this agent started: nothing to run or to clean up
            # (A pod that is already being deleted gets a worker that only removes it.)
            worker = self.workers[uid] = PodWorker(self._pod_context, pod)
            worker.start()

    def _on_delete(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            self.pods.pop(uid, None)
            worker = self.workers.get(uid)
        if worker is not None:
            worker.mark_gone()

    def _housekeeping_loop(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                self.refresh_dns()
                self._provision_claims()
                if self.echo_logs is not None:
                    self._echo()
            except Exception as e:
                if not self.stopping.is_set():
                    log.warning("housekeeping: %s", e)

    def pod_names(self, namespace: str) -> list[str]:
        with self._lock:
            return [
                p["metadata"]["name"]
                for p in self.pods.values()
                if p["metadata"]["namespace"] == namespace and not p["metadata"].get("deletionTimestamp")
            ]

    def pod_hostnames(self, namespace: str) -> list[str]:
        """``<hostname>.<subdomain>`` of the live pods of a namespace that set both (the names peers use)."""
        with self._lock:
            specs = [
                p["spec"]
                for p in self.pods.values()
                if p["metadata"]["namespace"] == namespace and not p["metadata"].get("deletionTimestamp")
            ]
        return [f"{s['hostname']}.{s['subdomain']}" for s in specs if s.get("hostname") and s.get("subdomain")]

    def refresh_dns(self) -> None:
        services = self.api.get("/api/v1/services")["items"]
        with self._lock:
            pods = list(self.pods.values())
        self.network.refresh(services, pods)

    # --- storage ----------------------------------------------------------------------

    def claim_path(self, namespace: str, claim: str) -> Path:
        """The local folder behind a PersistentVolumeClaim (raises NotReady while unbound)."""
        return claim_path(self.api, namespace, claim)

    def _provision_claims(self) -> None:
        """A hostPath PersistentVolume, pre-bound, for each pending claim that has none."""
        for pvc in self.api.get("/api/v1/persistentvolumeclaims")["items"]:
            meta, spec = pvc["metadata"], pvc["spec"]
            if spec.get("volumeName") or (pvc.get("status") or {}).get("phase") != "Pending":
                continue
            name = f"pvc-{meta['uid']}"
            path = self.storage / f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # as local-path provisioners make them: writable by the pods' non-root users
            request = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                "spec": {
                    "capacity": {"storage": request},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": spec.get("storageClassName") or "",
                    "volumeMode": spec.get("volumeMode", "Filesystem"),
                    "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": meta["namespace"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            }
            try:
                self.api.request("POST", "/api/v1/persistentvolumes", pv)
                log.info("provisioned %s for claim %s/%s at %s", name, meta["namespace"], meta["name"], path)
            except ApiError as e:
                if e.status != 409:
                    raise

    # --- inspection (tests, demo) -----------------------------------------------------

    def find_worker(self, namespace: str, name: str) -> PodWorker | None:
        """The newest worker for pod ``namespace/name`` (a recreated pod gets a new one)."""
        with self._lock:
            found = [w for w in self.workers.values() if (w.namespace, w.pod_name) == (namespace, name)]
        return found[-1] if found else None

    def logs(self, namespace: str, name: str, container: str | None = None, all_attempts: bool = True) -> str:
        """A pod container's output: every run of it (restarts included) or only the current one."""
        with self._lock:
            workers = [w for w in self.workers.values() if (w.namespace, w.pod_name) == (namespace, name)]
        out = []
        for w in workers:
            c = w.container(container)
            attempts = range(1, c.attempts + 1) if all_attempts else [c.attempts]
            out += [c.log_path(a).read_text(errors="replace") for a in attempts if c.log_path(a).exists()]
        return "".join(out)

    def kill(self, namespace: str, name: str, container: str | None = None, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to every process of a running container (a crash, an OOM kill); returns how many."""
        worker = self.find_worker(namespace, name)
        if worker is None:
            raise LookupError(f"pod {namespace}/{name} is not running on this agent")
        c = worker.container(container)
        pids = container_pids(c.marker) if c.running else []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return len(pids)

    def _echo(self) -> None:
        """Forward new log lines of every container to ``echo_logs`` (the demo's live view)."""
        assert self.echo_logs is not None
        offsets = self._echo_offsets
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            for c in w.init_containers + w.containers:
                if not c.attempts:
                    continue
                path = c.log_path()
                if not path.exists():
                    continue
                with path.open("rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                    cut = data.rfind(b"\n") + 1
                    offsets[path] = offsets.get(path, 0) + cut
                for line in data[:cut].decode(errors="replace").splitlines():
                    self.echo_logs(f"[{w.pod_name}/{c.name}] {line}")
