"""The fsdp-operator in a local cluster, installed from the bundle's own manifests (``kustomize/default``).

``install_operator`` applies what ``kubectl apply -k kustomize/default`` would:
the CRDs, the namespace, the ServiceAccount and its RBAC, the metrics Service
and (``deploy=True``) the Deployment. The operator then runs one of two ways,
with the same identity and the same command line:

- **as a pod** (``deploy=True``): the Deployment's pod, which the node agent
  runs like any other (``WholeCluster.install_operator``);
- **as a child process** (``deploy=False``, then ``OperatorInstall.process()``):
  for a cluster without nodes, and for tests that kill, restart or pause the
  operator or read its log. ``OperatorProcess`` runs the Deployment container's
  command line (the image's ENTRYPOINT ``fsdp-operator`` and its ``args``, with
  the ports moved to free loopback ones) and environment, with only the
  credentials of the Deployment's ServiceAccount (a token from the TokenRequest
  API), so RBAC applies to it exactly as to the pod.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from fsdp_api.ports import free_port

from .apiserver import TestCluster
from .binaries import REPO_ROOT, tool_path
from .processes import stop_process
from .wait import wait_for

Obj = dict[str, Any]

KUSTOMIZE_DEFAULT = REPO_ROOT / "kustomize" / "default"
# The explicit opt-in: the operator bound and serving every namespace.
KUSTOMIZE_CLUSTERWIDE = REPO_ROOT / "kustomize" / "overlays" / "clusterwide"
OPERATOR_NAMESPACE = "fsdp-system"  # kustomize/default's
# The one namespace kustomize/default serves (its --namespace and RoleBinding).
SERVED_NAMESPACE = "fsdp-training"
OPERATOR_DEPLOYMENT = "fsdp-operator"
OPERATOR_SERVICE_ACCOUNT = "fsdp-operator"  # the name kustomize/rbac gives it
# The operator image's ENTRYPOINT (Dockerfile), from this repository's virtualenv.
OPERATOR_ENTRYPOINT = ("fsdp-operator",)
FSDPTRAININGS = "fsdptrainings.training.fsdp.dev"


def kustomize(path: Path) -> str:
    """``kubectl kustomize`` with the local cluster's kubectl."""
    res = subprocess.run([str(tool_path("kubectl")), "kustomize", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed: {res.stderr}")
    return res.stdout


def can_i(cluster: TestCluster, kubeconfig: Path, *args: str) -> str:
    """``kubectl auth can-i`` as the kubeconfig's user: "yes" or "no"."""
    return cluster.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False).stdout.strip()


def operator_manifests(
    namespace: str = OPERATOR_NAMESPACE, env: Mapping[str, str] | None = None, *, clusterwide: bool = False
) -> list[Obj]:
    """The objects of kustomize/default (``clusterwide``: overlays/clusterwide), moved to ``namespace``.

    ``env`` overrides variables of the operator container. The move is made
    here rather than by a ``namespace:`` overlay: kustomize's namespace
    transformer would also move the default's RoleBinding out of the served
    namespace, and it drops the namespace of a binding subject that comes from
    another kustomization.
    """
    docs = [d for d in yaml.safe_load_all(kustomize(KUSTOMIZE_CLUSTERWIDE if clusterwide else KUSTOMIZE_DEFAULT)) if d]
    if namespace != OPERATOR_NAMESPACE:
        docs = [_moved(d, namespace) for d in docs]
    if env:
        container = operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0]
        kept = [e for e in container.get("env", []) if e["name"] not in env]
        container["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    return docs


def _moved(doc: Obj, namespace: str) -> Obj:
    """``doc`` with the operator's namespace replaced by ``namespace`` (its own, a binding's subjects)."""
    meta = doc["metadata"]
    if doc["kind"] == "Namespace" and meta["name"] == OPERATOR_NAMESPACE:
        meta["name"] = namespace
    if meta.get("namespace") == OPERATOR_NAMESPACE:
        meta["namespace"] = namespace
    for subject in doc.get("subjects", []) if doc["kind"] in ("RoleBinding", "ClusterRoleBinding") else []:
        if subject.get("namespace") == OPERATOR_NAMESPACE:
            subject["namespace"] = namespace
    return doc


def operator_deployment(docs: Sequence[Obj]) -> Obj:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == OPERATOR_DEPLOYMENT)


def operator_container(docs: Sequence[Obj]) -> Obj:
    return dict(operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0])


@dataclass
class OperatorInstall:
    """What ``install_operator`` applied, and (child-process mode) the ServiceAccount's kubeconfig."""

    cluster: TestCluster
    namespace: str
    manifests: list[Obj]
    kubeconfig: Path | None = None

    @property
    def container(self) -> Obj:
        """The Deployment's operator container: the command line and environment of either mode."""
        return operator_container(self.manifests)

    @property
    def service_account(self) -> str:
        return str(operator_deployment(self.manifests)["spec"]["template"]["spec"]["serviceAccountName"])

    def process(self, log_path: Path | str, *, kubeconfig: Path | str | None = None, **options: Any) -> OperatorProcess:
        """An operator child process (not started) as the Deployment's ServiceAccount, or as ``kubeconfig``'s user.

        ``options``: those of OperatorProcess (``namespace``, ``priority``,
        ``scrape_interval``, ``pod_name``, ``env``).
        """
        kubeconfig = kubeconfig or self.kubeconfig
        assert kubeconfig is not None, "installed with deploy=True: the operator runs as a pod"
        return OperatorProcess(kubeconfig, log_path, container=self.container, **options)


def install_operator(
    cluster: TestCluster,
    namespace: str = OPERATOR_NAMESPACE,
    *,
    deploy: bool = True,
    env: Mapping[str, str] | None = None,
    clusterwide: bool = False,
    timeout: float = 60.0,
) -> OperatorInstall:
    """Apply kustomize/default (``clusterwide``: overlays/clusterwide) in ``namespace``.

    Without ``deploy``, all but the Deployment.

    The CRDs are applied first and awaited (Established and served). Without
    ``deploy`` the result carries a kubeconfig of the Deployment's
    ServiceAccount, once its RBAC binding is effective.
    """
    docs = operator_manifests(namespace, env, clusterwide=clusterwide)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition" and (deploy or d["kind"] != "Deployment")]
    crd_file = cluster.workdir / "fsdp-operator-crds.yaml"
    crd_file.write_text(yaml.safe_dump_all(crds))
    cluster.install_crds(crd_file, timeout=timeout)
    cluster.apply(yaml.safe_dump_all(rest))
    installed = OperatorInstall(cluster, namespace, docs)
    if not deploy:
        kubeconfig = cluster.serviceaccount_kubeconfig(namespace, installed.service_account)
        # The API server's RBAC cache is eventually consistent: wait until the binding is effective.
        scope = ("-A",) if clusterwide else ("-n", SERVED_NAMESPACE)
        wait_for(
            lambda: can_i(cluster, kubeconfig, "watch", FSDPTRAININGS, *scope) == "yes",
            30,
            "the operator's RBAC binding",
            interval=0.1,
        )
        installed.kubeconfig = kubeconfig
    return installed


class OperatorProcess:
    """The operator container's command line, run as a local process; its log goes to ``log_path``.

    ``container``: the Deployment's container (``OperatorInstall.container``).
    Its ``args`` are kept, with ``--liveness`` and ``--metrics-port`` moved to
    free loopback ports (``liveness_port``, ``metrics_port``); ``namespace``
    replaces ``--all-namespaces``; ``priority`` and ``scrape_interval`` are
    added as flags. Its literal ``env`` is kept, ``POD_NAME`` (the downward
    API's pod name: the peering identity) is ``pod_name``, and ``env`` comes last.
    The log is appended to across restarts.
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        log_path: Path | str,
        *,
        container: Mapping[str, Any],
        namespace: str | None = None,
        priority: int | None = None,
        scrape_interval: float | None = None,
        pod_name: str = "fsdp-operator-local",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.log_path = Path(log_path)
        self.container = dict(container)
        self.namespace = namespace
        self.priority = priority
        self.scrape_interval = scrape_interval
        self.pod_name = pod_name
        self.extra_env = dict(env or {})
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        args: list[str] = []
        for a in self.container.get("args", []):
            if a.startswith("--liveness="):
                path = urllib.parse.urlsplit(a.split("=", 1)[1]).path or "/healthz"
                a = f"--liveness=http://127.0.0.1:{self.liveness_port}{path}"
            elif a.startswith("--metrics-port="):
                a = f"--metrics-port={self.metrics_port}"
            elif a in ("--all-namespaces", "-A") and self.namespace:
                a = f"--namespace={self.namespace}"
            args.append(a)
        if self.priority is not None:
            args.append(f"--priority={self.priority}")
        if self.scrape_interval is not None:
            args.append(f"--scrape-interval={self.scrape_interval}")
        entry = [str(Path(sys.executable).with_name(OPERATOR_ENTRYPOINT[0])), *OPERATOR_ENTRYPOINT[1:]]
        return [*entry, *args]

    def environment(self) -> dict[str, str]:
        """The container's literal variables and its pod name, then ``env``."""
        env = {e["name"]: str(e["value"]) for e in self.container.get("env", []) if "value" in e}
        for e in self.container.get("env", []):
            field_path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if field_path == "metadata.name":
                env[e["name"]] = self.pod_name
        return {**env, **self.extra_env}

    def start(self, wait: bool = True, timeout: float = 60.0) -> OperatorProcess:
        # Only this kubeconfig: no inherited KUBECONFIG or in-cluster token.
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        env.update({"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.environment()})
        log: IO[bytes] = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        if wait:
            self.wait_live(timeout)
        return self

    def wait_live(self, timeout: float = 60.0) -> None:
        """Until kopf's liveness endpoint answers (start-up handlers done, watching)."""

        def live() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc and self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                    return r.status == 200
            except (OSError, urllib.error.URLError):
                return False

        wait_for(live, timeout, "the operator's liveness endpoint", interval=0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as a crashed or OOM-killed pod."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (kopf's graceful exit), SIGKILL if it hangs."""
        return stop_process(self.proc, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 80) -> str:
        return "".join(self.log().splitlines(keepends=True)[-lines:])

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def liveness(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=5) as r:
            return str(r.read().decode())

    def _status_kb(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
        raise RuntimeError(f"{key} not in /proc/{self.pid}/status")

    def peak_rss_bytes(self) -> int:
        """VmHWM: the peak resident set size of the operator process so far."""
        return self._status_kb("VmHWM") * 1024

    def rss_bytes(self) -> int:
        """VmRSS: the resident set size now."""
        return self._status_kb("VmRSS") * 1024
