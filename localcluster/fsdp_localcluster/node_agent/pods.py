"""One pod of the node agent: volumes, environment, processes, restarts, status, deletion.

``PodWorker`` plays the kubelet's part for one pod (one thread per pod);
``ContainerRun`` (runs.py) is one container's process and history; ``PodSources``
(pod_sources.py) answers what the pod reads from the API server and its own object
(fields, keys, projected volumes, tokens); ``PodContext`` is
all a worker gets from its agent (the agent depends on this module, never
the reverse). The helpers below are the translation rules between a
container's view (mount paths, ``$(VAR)``, Service names, images) and this
machine's.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import fnmatch
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .client import ApiError, KubeAPI, Obj, now
from .containers import SITE_MOUNT, ContainerLaunch, remove_argv, runs_in_image
from .network import POD_IP_ENV, PodNetwork
from .pod_sources import CONFIG_ERROR, SERVICE_ACCOUNT_DIR, NotReady, PodSources, automount, claim_path
from .runs import CONTAINER_MARKER, ContainerRun

log = logging.getLogger("node-agent")

VENV_BIN = Path(sys.executable).parent
# How long a container start may wait for the Services its command names. A
# real process retries the lookup for as long as its own timeout allows (the
# rendered torchrun: its rendezvous join_timeout, 1800 s); here names are
# resolved once, at the start, so the start waits instead. A restarted peer
# (a stall restart, a preemption) is back well within this.
DNS_WAIT_SECONDS = 300.0


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined variables are substituted, ``$$`` escapes, the rest stays."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


def rewrite_paths(text: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """Replace container paths under a mount by the local folder backing it."""
    for mount_path, local in sorted(mounts, key=lambda m: -len(m[0])):
        if mount_path in ("/", "") or mount_path not in text:
            continue
        text = re.sub(rf"(?<![\w./-]){re.escape(mount_path.rstrip('/'))}(?=/|$|[^\w.-])", str(local), text)
    return text


def image_command(image_commands: Mapping[str, Sequence[str]], image: str) -> list[str] | None:
    """The ENTRYPOINT standing in for ``image``: the first fnmatch pattern of ``image_commands`` it matches."""
    for pattern, entry in image_commands.items():
        if fnmatch.fnmatch(image, pattern):
            return list(entry)
    return None


def resolve_executable(name: str, path: str) -> str:
    """The container's executable on this machine: this venv's copy when it has one."""
    base = os.path.basename(name)
    if (VENV_BIN / base).exists() and (base.startswith("python") or "/" not in name or not Path(name).exists()):
        return str(VENV_BIN / base)
    if "/" in name:
        return name
    return shutil.which(name, path=path) or name


@dataclass(frozen=True)
class PodContext:
    """What a PodWorker needs from its node agent, and nothing else."""

    api: KubeAPI
    network: PodNetwork
    pods_dir: Path  # each pod's folder goes under it
    agent_id: str  # makes container markers unique per agent
    node_ip: str
    node_capacity: Mapping[str, Mapping[str, str]]  # node name -> capacity (resourceFieldRef defaults)
    shim_dir: Path  # first on PATH: the nslookup shim
    site_dir: Path  # on PYTHONPATH: the sitecustomize shim
    bind_shim: Path | None  # LD_PRELOADed into processes (not containers): bind_shim.py
    extra_env: Mapping[str, str]
    image_commands: Mapping[str, Sequence[str]]
    restart_backoff: tuple[float, float]  # (first, max) seconds between container restarts
    max_grace: float  # cap on termination grace periods, in seconds
    stopping: threading.Event  # the agent is shutting down
    refresh_dns: Callable[[], None]  # rebuild the DNS table from the cluster now
    pod_names: Callable[[str], list[str]]  # live pods of a namespace (any node)
    pod_hostnames: Callable[[str], list[str]]  # "<hostname>.<subdomain>" of those that set both
    # Image mode: containers whose image matches one of these fnmatch patterns
    # run from it with podman (``containers``); the runc wrapper podman uses.
    image_patterns: Sequence[str] = ()
    runtime: Path | None = None
    api_server_ip: str | None = None  # the kubernetes Service's address (containers.ServiceProxy)


class PodWorker(threading.Thread):
    """Runs one pod: volumes, init containers, containers, restarts, status, deletion."""

    def __init__(self, ctx: PodContext, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.pod = pod
        self.namespace, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = ctx.pods_dir / f"{self.namespace}_{self.pod_name}_{self.uid[:8]}"
        self.ip = ctx.network.ip_for(self.namespace, self.pod_name)
        self.gone = False
        self._wake = threading.Event()
        self._lock = threading.Lock()
        spec = pod["spec"]
        marker = f"{ctx.agent_id}/{self.uid}"
        self.init_containers = [
            ContainerRun(c, True, self.dir / "logs", marker) for c in spec.get("initContainers", [])
        ]
        self.containers = [ContainerRun(c, False, self.dir / "logs", marker) for c in spec["containers"]]
        self.volumes: dict[str, Path] | None = None
        self.sa_dir: Path | None = None
        self.started = now()
        self.conditions: dict[str, Obj] = {}
        self.phase = "Pending"
        self._published: Obj | None = None
        self.terminal = False

    # --- called by the agent's watch thread ---------------------------------

    def update(self, pod: Obj) -> None:
        with self._lock:
            self.pod = pod
        self._wake.set()

    def mark_gone(self) -> None:
        self.gone = True
        self._wake.set()

    # --- the loop --------------------------------------------------------------

    @property
    def deleting(self) -> bool:
        return self.gone or bool(self.pod["metadata"].get("deletionTimestamp"))

    def run(self) -> None:
        while not self.deleting and not self.ctx.stopping.is_set():
            try:
                self._step()
                self._publish()
            except Exception:  # an API hiccup, a bug: keep the pod's processes, try again
                log.error("pod %s/%s: agent error\n%s", self.namespace, self.pod_name, traceback.format_exc())
                time.sleep(1)
            self._wake.wait(0.25)
            self._wake.clear()
        try:
            self._terminate()
        finally:
            self.kill_all()

    def _step(self) -> None:
        if self.terminal:
            return
        if self.volumes is None:
            try:
                self._prepare()
            except NotReady as e:
                for c in self.init_containers + self.containers:
                    c.waiting = ("ContainerCreating", str(e))
                return
        restart_policy = self.pod["spec"].get("restartPolicy", "Always")
        # Init containers run one at a time, in order, each to success.
        for c in self.init_containers:
            if c.terminated is not None and c.terminated["exitCode"] == 0 and not c.running:
                continue
            self._drive(c, "OnFailure" if restart_policy == "Always" else restart_policy)
            if c.terminated is not None and c.terminated["exitCode"] != 0 and restart_policy == "Never":
                self._finish("Failed")
            return
        self._set_condition("Initialized", True)
        for c in self.containers:
            self._drive(c, restart_policy)
        if all(c.terminated is not None and not c.running and c.next_start == 0 for c in self.containers):
            failed = any(c.terminated and c.terminated["exitCode"] != 0 for c in self.containers)
            self._finish("Failed" if failed else "Succeeded")
        else:
            self.phase = "Running" if any(c.attempts for c in self.containers) else "Pending"

    def _drive(self, c: ContainerRun, restart_policy: str) -> None:
        """Start, reap or restart one container according to the restart policy."""
        if c.running:
            return
        if c.proc is not None:
            term = c.reap()
            assert term is not None
            log.info("pod %s/%s container %s exited %s", self.namespace, self.pod_name, c.name, term["exitCode"])
            if restart_policy == "Always" or (restart_policy == "OnFailure" and term["exitCode"] != 0):
                # A short, capped exponential back-off (the kubelet's starts at 10 s).
                delay = min(self.ctx.restart_backoff[1], self.ctx.restart_backoff[0] * 2 ** min(c.restart_count, 6))
                c.next_start = time.monotonic() + delay
                c.last_terminated, c.terminated = term, None
                c.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container={c.name}")
            else:
                c.next_start = 0
            return
        if c.terminated is not None and c.next_start == 0:
            return  # done for good
        if c.next_start and time.monotonic() < c.next_start:
            return
        if c.next_start:
            c.restart_count += 1
            c.next_start = 0
        cleanup = None
        try:
            if self._in_image(c.spec):
                argv, env, cwd, cleanup = self._image_command(c)
            else:
                argv, env, cwd = self._command(c)
        except NotReady as e:
            c.waiting = (e.reason, str(e))
            return
        log.info("pod %s/%s starting %s: %s", self.namespace, self.pod_name, c.name, " ".join(argv))
        c.start(argv, env, cwd, cleanup)

    def _finish(self, phase: str) -> None:
        self.phase = phase
        self.terminal = True
        self._set_condition("Ready", False, "PodCompleted")
        self._set_condition("ContainersReady", False, "PodCompleted")
        self._set_condition("PodReadyToStartContainers", False)

    def _terminate(self) -> None:
        """Graceful stop: SIGTERM the main processes, wait the grace period, SIGKILL, remove the pod."""
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        grace = self.ctx.max_grace if grace is None else min(float(grace), self.ctx.max_grace)
        live = [c for c in self.init_containers + self.containers if c.running]
        for c in live:
            c.signal_main(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.running for c in live) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill_all()
        for c in live:
            c.reap()
        for path in (self.volumes or {}).values():
            if path.is_relative_to(self.dir / "volumes"):  # emptyDirs and projections, not claims
                shutil.rmtree(path, ignore_errors=True)
        if not self.gone and not self.ctx.stopping.is_set():
            # The kubelet's last word: remove the object now that nothing runs.
            body = {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid},
            }
            with contextlib.suppress(ApiError):
                self.ctx.api.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}", body)
        log.info("pod %s/%s terminated", self.namespace, self.pod_name)

    def kill_all(self) -> None:
        for c in self.init_containers + self.containers:
            c.kill_all()

    # --- set-up ---------------------------------------------------------------

    def _mounts(self, c: Obj) -> list[tuple[str, Path]]:
        assert self.volumes is not None
        mounts = []
        for m in c.get("volumeMounts", []):
            local = self.volumes[m["name"]]
            if m.get("subPath"):
                local = local / m["subPath"]
            mounts.append((m["mountPath"], local))
        if self.sa_dir is not None and not any(p == SERVICE_ACCOUNT_DIR for p, _ in mounts):
            mounts.append((SERVICE_ACCOUNT_DIR, self.sa_dir))
        return mounts

    def _prepare(self) -> None:
        """Materialise the pod's volumes as local folders (raises NotReady while a source is missing)."""
        ns, spec = self.namespace, self.pod["spec"]
        vol_root = self.dir / "volumes"
        volumes: dict[str, Path] = {}
        projected_files: list[Path] = []
        for v in spec.get("volumes", []):
            name, path = v["name"], vol_root / v["name"]
            if "emptyDir" in v:
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # as the kubelet makes them: any uid the container runs as can write
            elif "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                path = claim_path(self.ctx.api, ns, claim)
            elif "hostPath" in v:
                path = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                    path.mkdir(parents=True, exist_ok=True)
            elif "configMap" in v or "secret" in v or "projected" in v or "downwardAPI" in v:
                path.mkdir(parents=True, exist_ok=True)
                projected_files += self._sources().project(v, path)
            else:
                raise NotReady(f"volume {name!r}: unsupported volume type {sorted(set(v) - {'name'})}")
            volumes[name] = path
        self.volumes = volumes
        if automount(self.pod):
            self.sa_dir = self.dir / "serviceaccount"
            self.sa_dir.mkdir(parents=True, exist_ok=True)
            self._sources().write_service_account(self.sa_dir)
        # Files from ConfigMaps/Secrets name container paths: map them like the command line
        # (for process-mode containers; an image-mode container sees its mounts at their own paths).
        containers = [c for c in spec.get("initContainers", []) + spec["containers"] if not self._in_image(c)]
        mounts = [m for c in containers for m in self._mounts(c)]
        for f in projected_files:
            try:
                text = f.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            new = rewrite_paths(text, mounts)
            if new != text:
                f.write_text(new)
        self._set_condition("PodReadyToStartContainers", True)

    # --- command and environment ----------------------------------------------------

    def _sources(self) -> PodSources:
        """The pod's sources (fields, keys, tokens), as of the pod last seen."""
        return PodSources(self.ctx.api, self.pod, self.ctx.node_ip, self.ip, self.ctx.node_capacity)

    def _field(self, path: str) -> str:
        """A downward-API field of the pod (its environment's and its volumes' fieldRef)."""
        return self._sources().field(path)

    def _env(
        self, c: Obj, mounts: Sequence[tuple[str, Path]], contained: bool = False
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The container's environment: as the container sees it (for ``$(VAR)``), and as run here.

        ``contained``: for a container run from its image, whose image gives
        PATH and HOME and whose mounts are at their own paths.
        """
        api = urllib.parse.urlsplit(self.ctx.api.server)
        # What the image and the kubelet would provide, before the pod's own variables.
        image: dict[str, str] = {}
        if not contained:
            home = self.dir / "home"
            home.mkdir(parents=True, exist_ok=True)
            image = {
                "PATH": f"{self.ctx.shim_dir}:{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(home),
                "LANG": os.environ.get("LANG", "C.UTF-8"),
            }
        env: dict[str, str] = {
            **image,
            # The pod's hostname: spec.hostname when set (JobSet's, Indexed Jobs'), else its name.
            "HOSTNAME": self.pod["spec"].get("hostname") or self.pod_name,
            # In image mode, the kubernetes Service's address (what the kubelet's variables name).
            "KUBERNETES_SERVICE_HOST": (contained and self.ctx.api_server_ip) or api.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443" if contained else str(api.port or 443),
            "KUBERNETES_SERVICE_PORT_HTTPS": "443" if contained else str(api.port or 443),
            # The pod network is loopback; gloo must not pick another interface.
            "GLOO_SOCKET_IFNAME": "lo",
            # This machine reaches package registries only.
            "HF_HUB_OFFLINE": "1",
            **self.ctx.extra_env,
        }
        base = dict(env)
        sources = self._sources()
        for src in c.get("envFrom", []):
            prefix = src.get("prefix", "")
            kind, ref = ("configmaps", src["configMapRef"]) if "configMapRef" in src else ("secrets", src["secretRef"])
            obj = self.ctx.api.get_or_none(f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
            if obj is None and not ref.get("optional"):
                raise NotReady(f'{kind[:-1]} "{ref["name"]}" not found', CONFIG_ERROR)
            for k, v in ((obj or {}).get("data") or {}).items():
                env[prefix + k] = base64.b64decode(v).decode() if kind == "secrets" else v
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "valueFrom" in e:
                src = e["valueFrom"]
                value: str | None
                if "fieldRef" in src:
                    value = sources.field(src["fieldRef"]["fieldPath"])
                elif "resourceFieldRef" in src:
                    value = sources.resource(c, src["resourceFieldRef"])
                elif "configMapKeyRef" in src:
                    value = sources.lookup("configmaps", src["configMapKeyRef"])
                else:
                    value = sources.lookup("secrets", src["secretKeyRef"])
                if value is not None:
                    env[e["name"]] = value
            else:
                env[e["name"]] = ""
        # The pod's own values name container paths and Service hosts: map them
        # once, after expansion (``env`` keeps the container's view for $(VAR)).
        raw = env
        env = {k: v if base.get(k) == v else self._localize(v, [] if contained else mounts) for k, v in raw.items()}
        if not contained:
            for mount_path, local in mounts:
                if mount_path.rstrip("/") == "/tmp":
                    env.setdefault("TMPDIR", str(local))
            if self.sa_dir is not None:
                env.setdefault("KUBECONFIG", str(self.sa_dir / "kubeconfig"))
            if self.ctx.bind_shim is not None:
                env["LD_PRELOAD"] = " ".join(p for p in (str(self.ctx.bind_shim), env.get("LD_PRELOAD", "")) if p)
        site = SITE_MOUNT if contained else str(self.ctx.site_dir)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
        env[POD_IP_ENV] = self.ip
        return raw, env

    def _localize(self, text: str, mounts: Sequence[tuple[str, Path]]) -> str:
        return rewrite_paths(self.ctx.network.rewrite(text, self.namespace), mounts)

    def _command(self, run: ContainerRun) -> tuple[list[str], dict[str, str], Path]:
        c = run.spec
        self.ctx.refresh_dns()  # the peers' addresses as of now, not as of the last tick
        mounts = self._mounts(c)
        raw_env, env = self._env(c, mounts)
        command, args = c.get("command"), c.get("args")
        if not command:
            entry = image_command(self.ctx.image_commands, c.get("image", ""))
            if entry is None:
                raise NotReady(
                    f"image {c.get('image')!r} has no command and no entry in the agent's image_commands",
                    "CreateContainerError",
                )
            command = entry
        raw_argv = [expand(a, raw_env) for a in [*command, *(args or [])]]
        # Literal values only: a fieldRef (e.g. the pod's own name) is identity, not a host to reach.
        literals = [raw_env[e["name"]] for e in c.get("env", []) if "value" in e and e["name"] in raw_env]
        self._await_peer_names(run, [*raw_argv, *literals])
        argv = [self._localize(a, mounts) for a in raw_argv]
        argv[0] = resolve_executable(argv[0], env["PATH"])
        cwd = self.dir / "root"
        if c.get("workingDir"):
            mapped = Path(rewrite_paths(c["workingDir"], mounts))
            cwd = mapped if mapped != Path(c["workingDir"]) else cwd
        cwd.mkdir(parents=True, exist_ok=True)
        return argv, env, cwd

    def _in_image(self, c: Obj) -> bool:
        return self.ctx.runtime is not None and runs_in_image(self.ctx.image_patterns, c.get("image", ""))

    def _image_command(self, run: ContainerRun) -> tuple[list[str], dict[str, str], Path, list[str]]:
        """``podman run`` for a container from its image (containers.ContainerLaunch); and its cleanup."""
        assert self.ctx.runtime is not None and self.volumes is not None
        c, spec = run.spec, self.pod["spec"]
        image = c["image"]
        if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode != 0:
            # imagePullPolicy cannot pull here: the node has what `make images` built.
            raise NotReady(f'image "{image}" is not in this node\'s image store (make images)', "ErrImageNeverPull")
        security = {**(spec.get("securityContext") or {}), **(c.get("securityContext") or {})}
        if security.get("runAsNonRoot") and not self._runs_as_non_root(image, security.get("runAsUser")):
            # The kubelet's refusal (pkg/kubelet/kuberuntime/security_context_others.go verifyRunAsNonRoot).
            raise NotReady("container has runAsNonRoot and image will run as root", CONFIG_ERROR)
        self.ctx.refresh_dns()
        raw_env, env = self._env(c, self._mounts(c), contained=True)
        command = [expand(a, raw_env) for a in c.get("command") or []]
        args = [expand(a, raw_env) for a in c.get("args") or []]
        literals = [raw_env[e["name"]] for e in c.get("env", []) if "value" in e and e["name"] in raw_env]
        self._await_peer_names(run, [*command, *args, *literals])
        command = [self.ctx.network.rewrite(a, self.namespace) for a in command]
        args = [self.ctx.network.rewrite(a, self.namespace) for a in args]
        read_only = {m["mountPath"]: bool(m.get("readOnly")) for m in c.get("volumeMounts", [])}
        mounts = [(path, local, read_only.get(path, path == SERVICE_ACCOUNT_DIR)) for path, local in self._mounts(c)]
        mounts.append((SITE_MOUNT, self.ctx.site_dir, True))
        name = f"node-agent-{self.uid[:8]}-{run.name}-{run.attempts + 1}"
        launch = ContainerLaunch(
            name=name,
            image=image,
            command=command or None,
            args=args or None,
            env={**env, CONTAINER_MARKER: run.next_marker},
            mounts=mounts,
            hostname=spec.get("hostname") or self.pod_name,
            pod_ip=self.ip,
            working_dir=c.get("workingDir"),
            security=security,
            limits={k: str(v) for k, v in ((c.get("resources") or {}).get("limits") or {}).items()},
            api_server_ip=self.ctx.api_server_ip or "127.0.0.1",
        )
        host_env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
        host_env["PATH"] = host_env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        return launch.argv(self.ctx.runtime), host_env, self.dir, remove_argv(name, self.ctx.runtime)

    def _runs_as_non_root(self, image: str, run_as_user: int | None) -> bool:
        if run_as_user is not None:
            return int(run_as_user) != 0
        out = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Config.User}}", image], capture_output=True, text=True
        )
        user = out.stdout.strip().split(":")[0]
        return user.isdigit() and int(user) != 0

    def _await_peer_names(self, run: ContainerRun, texts: Sequence[str]) -> None:
        """Hold the start while the command names a pod of this namespace that DNS cannot resolve yet.

        A pod is named by its name or, when it sets ``spec.hostname`` and
        ``spec.subdomain`` (JobSet's pods, whose names end in a random suffix),
        by ``<hostname>.<subdomain>``. The training operator creates each pod's
        headless Service just after the pod; JobSet creates its one Service
        first, but a Job's pods one by one, so a peer may not exist yet: a name
        under this pod's own subdomain is a peer's too. Real DNS would answer
        once the Service selects the pod, and the process' retries would then
        succeed; here names are resolved once, when the process starts, so the
        start waits (at most DNS_WAIT_SECONDS) instead. A Service of the
        namespace that selects no live pod counts as such a name: after a
        stall restart or a preemption, the training operator re-creates a
        replica's pod only once the old one is gone, and the other pod must
        not start with a name that resolves to nothing (its rendezvous would
        never find the store, where real DNS would answer a moment later).
        """
        known = self.ctx.network.names_for(self.namespace)
        # A Service whose pod is being replaced (deleted, not yet re-created) is a
        # peer's name too, though no live pod carries it right now.
        names = [
            *self.ctx.pod_names(self.namespace),
            *self.ctx.pod_hostnames(self.namespace),
            *self.ctx.network.service_names(self.namespace),
        ]
        subdomain = self.pod["spec"].get("subdomain")
        if subdomain:
            under = rf"(?<![\w.-])[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\.{re.escape(subdomain)}(?![\w-])"
            names += [m.group(0) for t in texts for m in re.finditer(under, t)]
        names = list(dict.fromkeys(names))
        pending = [
            n
            for n in names
            if n not in known
            and not self.ctx.network.is_withheld(self.namespace, n)
            and any(re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", t) for t in texts)
        ]
        if not pending:
            return
        if run.dns_wait_since is None:
            run.dns_wait_since = time.monotonic()
        if time.monotonic() - run.dns_wait_since < DNS_WAIT_SECONDS:
            raise NotReady(f"waiting for the Service (DNS name) of {', '.join(pending)}")

    # --- status -----------------------------------------------------------------------

    def _set_condition(self, ctype: str, status: bool, reason: str | None = None) -> None:
        value = "True" if status else "False"
        old = self.conditions.get(ctype)
        if old is None or old["status"] != value:
            self.conditions[ctype] = {
                "type": ctype,
                "status": value,
                "lastTransitionTime": now(),
                "lastProbeTime": None,
            }
            if reason:
                self.conditions[ctype]["reason"] = reason

    def _status(self) -> Obj:
        if not self.terminal:
            ready = all(c.running for c in self.containers)
            self._set_condition("ContainersReady", ready, None if ready else "ContainersNotReady")
            self._set_condition("Ready", ready, None if ready else "ContainersNotReady")
            if "Initialized" not in self.conditions:
                self._set_condition("Initialized", not self.init_containers, "ContainersNotInitialized")
            self._set_condition("PodReadyToStartContainers", self.volumes is not None)
        self._set_condition("PodScheduled", True)
        images = {
            c["name"]: c.get("image", "")
            for c in self.pod["spec"].get("initContainers", []) + self.pod["spec"]["containers"]
        }
        status: Obj = {
            "phase": self.phase,
            "conditions": list(self.conditions.values()),
            "hostIP": self.ctx.node_ip,
            "hostIPs": [{"ip": self.ctx.node_ip}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.started,
            "containerStatuses": [c.status(images[c.name]) for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status(images[c.name]) for c in self.init_containers]
        return status

    def _publish(self) -> None:
        status = self._status()
        if status == self._published:
            return
        try:
            self.ctx.api.merge_patch(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status",
                {"metadata": {"uid": self.uid}, "status": status},
            )
            self._published = copy.deepcopy(status)
        except ApiError as e:
            # Gone, or replaced by a new pod of the same name (whose uid differs from ours).
            if e.status in (404, 409) or (e.status == 422 and "uid" in str(e)):
                self.gone = True
            else:
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.pod_name, e)

    # --- for tests -------------------------------------------------------------

    def container(self, name: str | None = None) -> ContainerRun:
        if name is None:
            return self.containers[0]
        return next(c for c in self.init_containers + self.containers if c.name == name)
