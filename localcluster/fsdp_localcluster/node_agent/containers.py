"""Image mode of the node agent: a pod's container run from its image, in a real container.

The process mode (``pods``) runs a container's command with this machine's
Python; image mode runs it with podman (OCI runtime runc) from the image the
pod names, as a kubelet and container runtime would: the image's filesystem,
user, ENTRYPOINT/CMD and environment, the pod's volumes bind-mounted at their
mount paths, and the container's ``securityContext`` (user and groups,
read-only root, capabilities, no privilege escalation) and CPU/memory limits.

What stays the agent's: the pod network (the host's network namespace, the
pod's own loopback address, names rewritten to addresses and the Python shim
mounted read-only, see ``network``), and the pod's lifecycle (``pods``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_api.pod_resources import parse_quantity

Obj = dict[str, Any]

# What cluster DNS answers for the API server (the kubernetes Service), e.g. to
# kopf's in-cluster login, which dials https://kubernetes.default.svc.
API_SERVER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

# Where the agent's Python shim (sitecustomize) appears inside a container.
SITE_MOUNT = "/run/node-agent/site"

# Two things every OCI bundle may ask for that this project's sandboxed
# machines (CI's among them) refuse, even to root:
# - rlimits: podman sets RLIMIT_NOFILE/NPROC in every container, containerd's
#   CRI sets RLIMIT_NOFILE, and setrlimit in the container's init fails even
#   to the current values ("error setting rlimits for ready process");
# - a lower oom_score_adj: containerd's CRI gives pod sandboxes -998, and the
#   write fails ("can't get final child's PID from pipe: EOF").
# podman and containerd get this runtime instead of runc: it drops the limits
# and keeps oom_score_adj at or above this process's own, then is runc. A real
# node needs neither change.
RUNC_FOR_THE_SANDBOX = """\
#!{python}
# Written by fsdp_localcluster (node_agent/containers.py).
import json, os, sys
args = sys.argv[1:]
for i, a in enumerate(args[:-1]):
    if a in ("--bundle", "-b"):
        path = os.path.join(args[i + 1], "config.json")
        with open(path) as f:
            spec = json.load(f)
        process = spec.get("process", {{}})
        process.pop("rlimits", None)
        with open("/proc/self/oom_score_adj") as f:
            floor = int(f.read())
        if process.get("oomScoreAdj", floor) < floor:
            process["oomScoreAdj"] = floor
        with open(path, "w") as f:
            json.dump(spec, f)
os.execv({runc!r}, ["runc", *args])
"""


class ImageModeUnavailable(RuntimeError):
    """podman or runc is missing."""


def image_mode_available() -> bool:
    """podman and runc are installed and this is root (rootful podman; the Service proxy binds port 443)."""
    return os.geteuid() == 0 and shutil.which("podman") is not None


def write_runtime(directory: Path) -> Path:
    """The runc wrapper podman runs containers with; raises ImageModeUnavailable without podman/runc."""
    if not shutil.which("podman"):
        raise ImageModeUnavailable("image mode needs podman and runc: run 'make system-deps'")
    return write_sandbox_runc(directory)


def write_sandbox_runc(directory: Path) -> Path:
    """``RUNC_FOR_THE_SANDBOX`` as an executable in ``directory``; raises ImageModeUnavailable without runc."""
    runc = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
    if not runc:
        raise ImageModeUnavailable("containers need runc: run 'make system-deps'")
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "runc-for-the-sandbox"
    wrapper.write_text(RUNC_FOR_THE_SANDBOX.format(python=sys.executable, runc=runc))
    wrapper.chmod(0o755)
    return wrapper


def runs_in_image(patterns: Sequence[str], image: str) -> bool:
    return any(fnmatch.fnmatch(image, p) for p in patterns)


def _quantity(q: str) -> float:
    return float(parse_quantity(str(q)))


@dataclass(frozen=True)
class ContainerLaunch:
    """Everything ``podman run`` needs for one container attempt."""

    name: str  # the podman container name (unique per attempt)
    image: str
    command: Sequence[str] | None  # the pod's command: replaces the ENTRYPOINT (and the CMD)
    args: Sequence[str] | None  # the pod's args: replace the CMD
    env: Mapping[str, str]
    mounts: Sequence[tuple[str, Path, bool]]  # (container path, host path, read-only)
    hostname: str
    pod_ip: str
    working_dir: str | None
    security: Obj  # the container's securityContext merged over the pod's
    limits: Mapping[str, str]  # the container's resources.limits
    api_server_ip: str = "127.0.0.1"  # where API_SERVER_NAMES point
    # "host": the agent's pod network on the host's loopback; "none": a network
    # namespace of its own with only a loopback (a lone pod, whose ports then
    # clash with nothing else on the machine).
    network: str = "host"

    def argv(self, runtime: Path) -> list[str]:
        sc = self.security
        argv = [
            "podman",
            "--runtime",
            str(runtime),
            "run",
            "--rm",
            "--name",
            self.name,
            "--pull=never",
            # The pod network is the host's loopback (see network.PodNetwork), or a loopback of its own.
            f"--network={self.network}",
            "--hostname",
            self.hostname,
            # The kubelet's /etc/hosts line: the pod's own name is its address.
            "--add-host",
            f"{self.hostname}:{self.pod_ip}",
            *(a for n in API_SERVER_NAMES for a in ("--add-host", f"{n}:{self.api_server_ip}")),
            # The output goes straight to the agent's log file.
            "--log-driver=passthrough",
            # Kubernetes adds no tmpfs to a read-only root: /tmp is writable only if the pod mounts it.
            "--read-only-tmpfs=false",
        ]
        if sc.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
        user = sc.get("runAsUser")
        if user is not None:
            group = sc.get("runAsGroup")
            argv += ["--user", f"{user}:{group}" if group is not None else str(user)]
        for gid in [sc.get("fsGroup"), *(sc.get("supplementalGroups") or [])]:
            if gid is not None:
                argv += ["--group-add", str(gid)]
        caps = sc.get("capabilities") or {}
        argv += [f"--cap-drop={c}" for c in caps.get("drop") or []]
        argv += [f"--cap-add={c}" for c in caps.get("add") or []]
        if sc.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        if sc.get("privileged"):
            argv.append("--privileged")
        # Limits this machine can honour: no more CPUs or memory than it has.
        if "cpu" in self.limits:
            argv += ["--cpus", f"{min(_quantity(self.limits['cpu']), float(os.cpu_count() or 1)):.2f}"]
        if "memory" in self.limits:
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            memory = int(min(_quantity(self.limits["memory"]), physical))
            argv += ["--memory", str(memory), "--memory-swap", str(memory)]
        for target, source, read_only in self.mounts:
            argv += ["--mount", f"type=bind,src={source},dst={target}{',ro=true' if read_only else ''}"]
        for k, v in self.env.items():
            argv += ["--env", f"{k}={v}"]
        if self.working_dir:
            argv += ["--workdir", self.working_dir]
        if self.command:
            argv += ["--entrypoint", json.dumps(list(self.command))]
        argv.append(self.image)
        if self.args:
            argv += list(self.args)
        return argv


def remove_argv(name: str, runtime: Path) -> list[str]:
    """Remove a container that is still there (its podman was killed with it)."""
    return ["podman", "--runtime", str(runtime), "rm", "--force", "--time", "0", "--ignore", name]


class ServiceProxy:
    """The ``kubernetes`` Service for image-mode pods: ``<ip>:443`` forwarded to the API server, as kube-proxy does.

    In-cluster clients dial ``https://kubernetes.default.svc`` on port 443
    (kopf hardcodes it); the local API server listens on a free port.
    """

    PORT = 443

    def __init__(self, ip: str, target: tuple[str, int]) -> None:
        self.ip, self.target = ip, target
        self._server = socket.create_server((ip, self.PORT), reuse_port=False)
        self._stop = threading.Event()
        threading.Thread(target=self._accept, name="node-agent-service-proxy", daemon=True).start()

    def _accept(self) -> None:
        self._server.settimeout(0.5)
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._pipe_both, args=(client,), daemon=True).start()

    def _pipe_both(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
