"""Run the fsdp operator as a child process with a given kubeconfig (tests and bench).

The operator runs as ``python -m fsdp_operator.controller`` (the same
run_operator as ``fsdp-operator run``) with only the credentials in the
kubeconfig it is given, e.g. a ServiceAccount's from
``TestCluster.serviceaccount_kubeconfig``, so RBAC applies to it exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from tests.support.cluster import REPO_ROOT, TestCluster, free_port, tool_path

OPERATOR_SERVICE_ACCOUNT = "fsdp-operator"  # the name kustomize/rbac gives it
FSDPTRAININGS = "fsdptrainings.training.fsdp.dev"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except AssertionError as e:  # a predicate may assert to explain itself
            last_error = e
        if time.monotonic() > deadline:
            detail = f" (last: {last_error})" if last_error else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}{detail}")
        time.sleep(interval)


def kustomize(path: Path) -> str:
    """``kubectl kustomize`` with the test cluster's kubectl."""
    res = subprocess.run([str(tool_path("kubectl")), "kustomize", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed: {res.stderr}")
    return res.stdout


def can_i(cluster: TestCluster, kubeconfig: Path, *args: str) -> str:
    """``kubectl auth can-i`` as the kubeconfig's user: "yes" or "no"."""
    return cluster.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False).stdout.strip()


def install_operator(cluster: TestCluster, namespace: str, workdir: Path) -> Path:
    """Install kustomize/crd and kustomize/rbac (in ``namespace``); return the ServiceAccount's kubeconfig.

    The RBAC goes through a small overlay that sets the namespace, the way
    kustomize/default does, so the binding's subject follows the ServiceAccount.
    """
    crds = workdir / "crds.yaml"
    crds.write_text(kustomize(REPO_ROOT / "kustomize" / "crd"))
    cluster.install_crds(crds)
    overlay = workdir / "rbac-overlay"
    overlay.mkdir(exist_ok=True)
    rel = os.path.relpath(REPO_ROOT / "kustomize" / "rbac", overlay)
    (overlay / "kustomization.yaml").write_text(f"namespace: {namespace}\nresources:\n  - {rel}\n")
    cluster.create_namespace(namespace)
    cluster.apply(kustomize(overlay))
    kubeconfig = cluster.serviceaccount_kubeconfig(namespace, OPERATOR_SERVICE_ACCOUNT)
    # The API server's RBAC cache is eventually consistent: wait until the binding is effective.
    wait_for(lambda: can_i(cluster, kubeconfig, "watch", FSDPTRAININGS, "-A") == "yes", 30, what="the RBAC binding")
    return kubeconfig


class OperatorProcess:
    """One operator instance; its log goes to ``log_path`` (appended across restarts)."""

    def __init__(
        self,
        kubeconfig: Path | str,
        log_path: Path | str,
        *,
        namespace: str | None = None,
        peering: str = "fsdp-operator",
        standalone: bool = False,
        priority: int | None = None,
        scrape_interval: float | None = None,
        env: Mapping[str, str] | None = None,
        argv: list[str] | None = None,
    ) -> None:
        """``argv`` (settable later) replaces the whole command line, e.g. a Deployment's;
        it should then serve on ``liveness_port``/``metrics_port``, chosen here."""
        self.kubeconfig = Path(kubeconfig)
        self.log_path = Path(log_path)
        self.namespace = namespace
        self.peering = peering
        self.standalone = standalone
        self.priority = priority
        self.scrape_interval = scrape_interval
        self.extra_env = dict(env or {})
        self.argv = argv
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        if self.argv is not None:
            return list(self.argv)
        cmd = [sys.executable, "-m", "fsdp_operator.controller"]
        cmd += ["--namespace", self.namespace] if self.namespace else ["--all-namespaces"]
        cmd += [
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
            f"--metrics-port={self.metrics_port}",
            f"--peering={self.peering}",
        ]
        if self.standalone:
            cmd.append("--standalone")
        if self.priority is not None:
            cmd.append(f"--priority={self.priority}")
        if self.scrape_interval is not None:
            cmd.append(f"--scrape-interval={self.scrape_interval}")
        return cmd

    def start(self, wait: bool = True, timeout: float = 60.0) -> OperatorProcess:
        # Only this kubeconfig: no inherited KUBECONFIG or in-cluster token.
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        env.update({"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.extra_env})
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

        wait_for(live, timeout, 0.1, "the operator's liveness endpoint")

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
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

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
