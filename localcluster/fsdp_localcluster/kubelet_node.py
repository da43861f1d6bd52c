"""A real node on this machine: the kubelet (built from the Kubernetes module) on containerd, with a CNI bridge.

The node agent (``node_agent``) emulates a kubelet for the whole-cluster
tests; this runs the real one, so that what only a kubelet and a container
runtime do is seen as on EKS: the pod sandbox and its network namespace, the
ConfigMap volume's atomic writer, memory-backed emptyDirs with their size
limit, ``fsGroup`` ownership, the securityContext (user, groups, read-only
root, capabilities, no-new-privileges, the RuntimeDefault seccomp profile),
cgroup limits, graceful termination (SIGTERM, grace period, SIGKILL) and the
container statuses it reports.

What this machine needs that a real node does not (each a setting):

- ``failCgroupV1: false``: the machine has cgroup v1, which the kubelet
  refuses by default since 1.35 (KEP-5573, "cgroup v1 unsupported");
- ``cgroupDriver: cgroupfs`` (no systemd) and a cgroup root of the node's own;
- runc through ``RUNC_FOR_THE_SANDBOX`` (no rlimits, no lower oom_score_adj);
- a local pod sandbox image (``LOCAL_PAUSE_IMAGE``), and images loaded from
  buildah's store into containerd (nothing can be pulled);
- no cluster DNS or kube-proxy: a pod knows its own name (/etc/hosts), not
  other pods' or Services' names. One node, so one-node trainings only.

containerd is Debian's (1.6.x), CNI's bridge and host-local plugins are
Debian's ``containernetworking-plugins``. One node per machine at a time (a
lock file), because its bridge, subnet and ports are fixed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from fsdp_api.ports import free_port

from .apiserver import TestCluster, tail
from .binaries import ensure_tools, tool_path
from .images import LOCAL_PAUSE_IMAGE
from .node_agent.containers import write_sandbox_runc
from .processes import stop_process
from .wait import wait_for

CNI_PLUGINS = Path("/usr/lib/cni")
BRIDGE = "fsdpk0"
SUBNET = "10.244.77.0/24"  # pods' addresses: on the bridge only, never routed off this machine
LOCK = Path(tempfile.gettempdir()) / "fsdp-kubelet-node.lock"
NAMESPACE = "k8s.io"  # containerd's namespace for CRI (the kubelet's) containers and images
# containerd's content and snapshots outlive a node (a fresh node per test session), so the 13 GB
# trainer image is loaded once per build, not per session: its state and containers stay per node.
_CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
log = logging.getLogger(__name__)
IMAGE_STORE = Path(os.environ.get("FSDP_TOOLS_CACHE") or _CACHE_HOME / "fsdp-k8s") / "kubelet-containerd"
# The image label that names the buildah image an import came from (its ID changes with every build).
SOURCE_LABEL = "fsdp-k8s.dev/buildah-image-id"


class KubeletNodeUnavailable(RuntimeError):
    """Something the node needs is missing (root, containerd, the CNI plugins, buildah, the kubelet)."""


def missing_requirements() -> list[str]:
    """What this machine lacks for a KubeletNode, as install hints (empty: it can run one)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (a kubelet and containerd manage mounts, cgroups and network namespaces)")
    for tool in ("containerd", "ctr", "buildah", "ip"):
        if not shutil.which(tool) and not shutil.which(tool, path="/usr/sbin:/sbin"):
            missing.append(f"{tool} (make system-deps)")
    if not (CNI_PLUGINS / "bridge").exists():
        missing.append(f"{CNI_PLUGINS}/bridge (make system-deps: containernetworking-plugins)")
    return missing


def _cgroup_roots() -> list[Path]:
    """Every cgroup hierarchy's mount point (v1: one per controller; v2: the one)."""
    roots = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            roots.append(Path(mount))
    return roots


def _cgroup_v1() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


class KubeletNode:
    """containerd + kubelet registered with ``cluster`` as node ``name``; ``start()``, ``load_image()``, ``stop()``."""

    def __init__(
        self,
        cluster: TestCluster,
        name: str = "kubelet-0",
        labels: Mapping[str, str] | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.cluster, self.name = cluster, name
        self.labels = dict(labels or {})
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fsdp-kubelet-node-"))
        self.socket = self.workdir / "containerd.sock"
        self.root_dir = self.workdir / "kubelet"
        self.log_dir = self.workdir / "pod-logs"
        self.cgroup = f"/fsdp-{name}"
        self.port, self.healthz_port = free_port(), free_port()
        self._lock: IO[str] | None = None
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 120.0) -> KubeletNode:
        missing = missing_requirements()
        if missing:
            raise KubeletNodeUnavailable("a real kubelet node needs " + "; ".join(missing))
        ensure_tools(("kubelet",))
        self._lock = LOCK.open("w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one node per machine: the bridge and subnet are fixed
        try:
            self._start_containerd(timeout)
            self.load_image(LOCAL_PAUSE_IMAGE)
            self._start_kubelet(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the kubelet, every container and containerd; unmount and remove what the node made."""
        if self._kubelet is not None:
            # The pods go first, as a drain would: their containers get their grace period.
            self.cluster.kubectl(
                "delete", "pods", "-A", f"--field-selector=spec.nodeName={self.name}", "--timeout=90s", check=False
            )
            stop_process(self._kubelet, 30)
            self._kubelet = None
        if self._containerd is not None:
            self._remove_containers()
            stop_process(self._containerd, 30)
            self._containerd = None
        # Shims outlive containerd; each was started with this node's socket.
        subprocess.run(["pkill", "-KILL", "-f", f"containerd-shim.*{self.socket}"], capture_output=True)
        self._unmount_all()
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        for root in _cgroup_roots():
            self._remove_cgroup(root / self.cgroup.lstrip("/"))
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> KubeletNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------- images

    def load_image(self, image: str) -> float:
        """Copy ``image`` from buildah's store into the node's containerd; the seconds it took.

        A no-op (0.0) when the image store already holds this build of it.
        """
        t0 = time.monotonic()
        source = subprocess.run(
            ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if source and f"{SOURCE_LABEL}={source}" in self._ctr("images", "list", f"name=={image}", check=False):
            return 0.0
        err = self._import(image)
        if err and "does not exist" in err:
            # The store outlives the node (IMAGE_STORE): an import that another run left half done
            # leaves snapshots whose parents are gone ("parent snapshot ... does not exist: not
            # found", seen in a clean-clone run). The failed import gave them up; a second one
            # unpacks the layers afresh.
            log.warning("importing %s failed (%s); removing it and importing again", image, err.strip()[-200:])
            self._ctr("images", "rm", image, check=False)
            err = self._import(image)
        if err:
            raise KubeletNodeUnavailable(f"cannot load {image} into the node's containerd: {err.strip()[-500:]}")
        if source:
            self._ctr("images", "label", image, f"{SOURCE_LABEL}={source}")
        return time.monotonic() - t0

    def _import(self, image: str) -> str:
        """Stream ``image`` from buildah into containerd; what went wrong ("" when it worked)."""
        push = subprocess.Popen(
            ["buildah", "push", "--quiet", image, f"docker-archive:/dev/stdout:{image}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert push.stdout is not None
        load = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, "images", "import", "-"],
            stdin=push.stdout,
            capture_output=True,
            text=True,
        )
        push.stdout.close()
        pushed = push.wait()
        if pushed != 0 or load.returncode != 0:
            return (push.stderr.read().decode(errors="replace") if push.stderr else "") + load.stderr or "failed"
        return ""

    # ------------------------------------------------------------ pods on the node

    def pod_dir(self, uid: str) -> Path:
        """The kubelet's folder of a pod (``volumes/kubernetes.io~empty-dir/<name>`` holds its emptyDirs)."""
        return self.root_dir / "pods" / uid

    def container_log(self, namespace: str, pod: str, uid: str, container: str) -> str:
        """What ``kubectl logs`` shows (the CRI log files' messages), from the node's pod log folder.

        By uid: the folder of an earlier pod of the same name can still be there.
        """
        lines = []
        for path in sorted(self.log_dir.glob(f"{namespace}_{pod}_{uid}/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                # CRI log format: <time> <stream> <P|F> <message>
                parts = line.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else line)
        return "\n".join(lines)

    # ---------------------------------------------------------------- internals

    def _ctr(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args], capture_output=True, text=True
        )
        if check and out.returncode != 0:
            raise KubeletNodeUnavailable(f"ctr {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _start_containerd(self, timeout: float) -> None:
        runc = write_sandbox_runc(self.workdir / "runtime")
        cni = self.workdir / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-fsdp-node.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "fsdp-node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": SUBNET}]],
                                "dataDir": str(self.workdir / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                }
            )
        )
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        config = self.workdir / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{IMAGE_STORE}"
state = "{self.workdir / "containerd/state"}"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.workdir / "containerd/opt"}"
{cri}
  sandbox_image = "{LOCAL_PAUSE_IMAGE}"
  enable_cdi = false
{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{runc}"
{cri[:-1]}.cni]
  bin_dir = "{CNI_PLUGINS}"
  conf_dir = "{cni}"
"""
        )
        containerd = shutil.which("containerd") or "containerd"
        self._containerd = self._spawn("containerd", [containerd, "--config", str(config)])

        def serving() -> bool:
            self._exited("containerd", self._containerd)
            version = ["ctr", "--address", str(self.socket), "version"]
            return self.socket.exists() and subprocess.run(version, capture_output=True).returncode == 0

        wait_for(serving, timeout, "containerd to serve")
        self._remove_containers()  # an earlier node that did not stop cleanly left them in the shared store

    def _remove_containers(self) -> None:
        for container in self._ctr("containers", "list", "--quiet", check=False).split():
            self._ctr("tasks", "kill", "--signal", "SIGKILL", container, check=False)
            self._ctr("tasks", "delete", "--force", container, check=False)
            self._ctr("containers", "delete", container, check=False)

    def _start_kubelet(self, timeout: float) -> None:
        for root in _cgroup_roots():
            (root / self.cgroup.lstrip("/")).mkdir(exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": not _cgroup_v1(),
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.log_dir),
            # The API server reaches this kubelet only for logs/exec, which the tests do not use.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "address": "127.0.0.1",
            "port": self.port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "readOnlyPort": 0,
            "failSwapOn": False,
            "resolvConf": "/etc/resolv.conf",
            # A shared disk that is already fairly full must not evict the pods or their images.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self._kubelet = self._spawn(
            "kubelet",
            [
                str(tool_path("kubelet", build=False)),
                f"--config={path}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--hostname-override={self.name}",
                f"--root-dir={self.root_dir}",
                f"--cert-dir={self.workdir / 'kubelet-pki'}",
                *([f"--node-labels={labels}"] if labels else []),
                "--v=2",
            ],
        )

        def ready() -> bool:
            self._exited("kubelet", self._kubelet)
            out = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for(ready, timeout, f"node {self.name} to be Ready")

    def _exited(self, name: str, proc: subprocess.Popen[bytes] | None) -> None:
        """Raise with the tail of its log if ``name`` has exited while starting."""
        if proc is not None and proc.poll() is not None:
            raise KubeletNodeUnavailable(
                f"{name} exited ({proc.returncode}):\n{tail(self.workdir / f'{name}.log', 40)}"
            )

    def _unmount_all(self) -> None:
        """Everything the kubelet and containerd mounted under the workdir (tmpfs volumes, rootfs, shm)."""
        prefix = str(self.workdir) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "--lazy", mount], capture_output=True)

    @staticmethod
    def _remove_cgroup(path: Path) -> None:
        """The node's cgroup and every cgroup the kubelet made under it, deepest first."""
        if not path.is_dir():
            return
        children = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for cgroup in [*children, path]:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
