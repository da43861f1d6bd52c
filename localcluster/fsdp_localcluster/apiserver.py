"""A real, throwaway Kubernetes API: etcd + kube-apiserver on loopback (``TestCluster``).

Both run as child processes on loopback ports, built from Go modules by
``tools/build-binaries.sh`` (see ``docs/test-cluster.md``). There is no kubelet,
scheduler or controller-manager: objects are stored and validated for real
(OpenAPI schemas, CEL rules, RBAC, admission), but nothing runs pods
(``control_plane`` and ``node_agent`` add that; ``whole_cluster`` has it all).

Typical use (the session fixture ``cluster`` in ``tests/conftest.py`` does this)::

    c = TestCluster()
    c.start()
    c.kubectl("get", "crd")
    c.stop()
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from fsdp_api.ports import free_port

from .binaries import ensure_tools, tool_path, vendored_crds
from .pki import b64, generate_pki
from .processes import stop_process

# Third-party CRDs (vendored: fsdp_localcluster/crds/) installed in every cluster.
DEFAULT_CRD_DIRS = ("kubeflow-training-operator-v1", "kubeflow-trainer-v2", "karpenter", "prometheus-operator")
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"


class ClusterStartError(RuntimeError):
    """etcd or kube-apiserver did not become ready; the message carries their logs."""


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message shows the command, stdout and stderr."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` of a log file (or a note that it does not exist)."""
    if not path.exists():
        return f"({path} does not exist)"
    return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])


class TestCluster:
    """etcd + kube-apiserver (RBAC on) on loopback, with the shared CRDs installed."""

    __test__ = False  # the name starts with "Test"; keep pytest from collecting it

    def __init__(
        self,
        workdir: Path | None = None,
        extra_crds: Iterable[str | Path] = (),
        crds: Iterable[str | Path] | None = None,
    ) -> None:
        """``extra_crds``: more CRD files/dirs to install (and wait for) at start().

        ``crds``: instead of the shared third-party CRDs, exactly these (e.g. an
        older Karpenter's, to test the manifests against a minimum version).
        """
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fsdp-test-cluster-"))
        self.extra_crds = [Path(p) for p in extra_crds]
        self.crds = [Path(p) for p in crds] if crds is not None else None
        self.pki = self.workdir / "pki"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self.startup_seconds: dict[str, float] = {}
        self._atexit_registered = False

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 120.0) -> TestCluster:
        """Build tools if needed, then start etcd and the apiserver and install CRDs."""
        self.startup_seconds = {}
        last = time.monotonic()

        def lap(step: str) -> None:  # record how long each start-up step took
            nonlocal last
            now = time.monotonic()
            self.startup_seconds[step], last = round(now - last, 2), now

        ensure_tools()
        lap("tools")
        generate_pki(self.pki)
        admin = {
            "client-certificate-data": b64(self.pki / "admin.crt"),
            "client-key-data": b64(self.pki / "admin.key"),
        }
        self.write_kubeconfig(self.kubeconfig, admin)
        lap("pki")
        self._start_etcd(timeout)
        lap("etcd")
        self.start_apiserver(timeout)
        lap("apiserver")
        base = self.crds if self.crds is not None else [vendored_crds(d) for d in DEFAULT_CRD_DIRS]
        self.install_crds(*base, *self.extra_crds, timeout=timeout)
        lap("crds")
        return self

    def stop(self, keep_workdir: bool = False) -> None:
        """Stop the apiserver and etcd; remove the work dir unless asked (or FSDP_KEEP_CLUSTER=1)."""
        self.stop_apiserver()
        self._terminate(self._etcd)
        self._etcd = None
        if not (keep_workdir or os.environ.get("FSDP_KEEP_CLUSTER")):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TestCluster:
        try:
            return self.start()
        except BaseException:  # a start that failed halfway leaves nothing running (with skips __exit__)
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        # Children share our process group, so Ctrl-C stops them too; atexit
        # covers an interpreter that exits without running the teardown.
        if not self._atexit_registered:
            atexit.register(self._kill_children)
            self._atexit_registered = True
        # Output goes to a file (not a pipe nobody reads, which would block the
        # process once full); the file is appended to across restarts.
        log: IO[bytes] = (self.workdir / f"{name}.log").open("ab")
        try:
            return subprocess.Popen(
                [str(tool_path(name, build=False)), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()

    def _start_etcd(self, timeout: float) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._etcd = self._spawn(
            "etcd",
            [
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}",
                # Test data is disposable: skipping fsync makes every write much faster.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait_ready("etcd", f"{client}/health", self._etcd, timeout, ok=lambda body: '"health":"true"' in body)

    def start_apiserver(self, timeout: float = 120.0) -> None:
        """(Re)start kube-apiserver on the same port, against the same etcd."""
        if self._apiserver is not None and self._apiserver.poll() is None:
            return  # already running
        p = self.pki
        self._apiserver = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={p / 'server.crt'}",
                f"--tls-private-key-file={p / 'server.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                # Enforce RBAC like a real cluster, so tests see the operator's true permissions.
                "--authorization-mode=RBAC",
                # Service-account token issuing/validation, needed by the TokenRequest API.
                # The issuer is the API server's own address, so that its OIDC discovery
                # (/.well-known/openid-configuration) answers at the issuer's URL: what a
                # verifier of projected tokens needs (Kubeflow Trainer's status server).
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # Default admission plugins, minus ServiceAccount: with no
                # controller-manager no "default" ServiceAccount ever appears, and
                # that plugin would then reject every pod.
                "--disable-admission-plugins=ServiceAccount",
                # The `kubernetes` Service's endpoint would be 127.0.0.1, which the
                # API rejects (loopback); skip reconciling it instead of logging errors.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait_ready(
            "kube-apiserver", f"{self.server}/readyz", self._apiserver, timeout, ok=lambda body: body.strip() == "ok"
        )

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (etcd keeps running, so data survives start_apiserver()).

        kube-apiserver keeps serving open watches for a long time after
        SIGTERM; clients must survive an abrupt loss anyway, so don't wait long.
        """
        self._terminate(self._apiserver, timeout=5.0)
        self._apiserver = None

    def _kill_children(self) -> None:
        for proc in (self._apiserver, self._etcd):
            if proc is not None and proc.poll() is None:
                proc.kill()

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
        stop_process(proc, timeout)

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _wait_ready(
        self, name: str, url: str, proc: subprocess.Popen[bytes], timeout: float, ok: Callable[[str], bool]
    ) -> None:
        ctx = self._ssl_context() if url.startswith("https") else None
        deadline = time.monotonic() + timeout
        body = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterStartError(f"{name} exited with {proc.returncode}\n{self.logs(name)}")
            try:
                with urllib.request.urlopen(url, timeout=5, context=ctx) as r:
                    body = r.read().decode()
                if ok(body):
                    return
            except (OSError, urllib.error.URLError) as e:  # not listening yet, or 500 while starting
                body = str(e)
            time.sleep(0.2)
        raise ClusterStartError(f"{name} not ready after {timeout}s at {url}: {body}\n{self.logs(name)}")

    def readyz(self, verbose: bool = False) -> str:
        """The apiserver's /readyz body (raises on a non-2xx answer)."""
        url = f"{self.server}/readyz" + ("?verbose" if verbose else "")
        with urllib.request.urlopen(url, timeout=10, context=self._ssl_context()) as r:
            return str(r.read().decode())

    def logs(self, name: str | None = None, lines: int = 60) -> str:
        """The last ``lines`` of the etcd/kube-apiserver logs (both when ``name`` is None)."""
        names = [name] if name else ["etcd", "kube-apiserver"]
        return "\n".join(
            f"----- {n}.log (last {lines} lines) -----\n{tail(self.workdir / f'{n}.log', lines)}" for n in names
        )

    # ------------------------------------------------------------------ kubectl

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (as admin unless ``kubeconfig`` is given)."""
        cmd = [str(tool_path("kubectl", build=False)), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        # A private discovery cache: ports are reused across runs, and a stale
        # ~/.kube/cache entry for the same host:port would confuse kubectl.
        env = {**os.environ, "KUBECACHEDIR": str(self.workdir / "kubectl-cache")}
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, env=env, timeout=timeout)
        if check and res.returncode != 0:
            raise KubectlError(res.returncode, cmd, res.stdout, res.stderr)
        return res

    def apply(
        self, obj: str | os.PathLike[str] | Mapping[str, Any], namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply`` a file/dir path, YAML text, or a manifest dict.

        Server-side apply: no size limit from the last-applied annotation
        (large CRDs exceed it) and conflicts with other managers are forced.
        """
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=fsdp-tests"]
        if namespace:
            args.append(f"--namespace={namespace}")
        if isinstance(obj, Mapping):
            return self.kubectl(*args, "-f", "-", input=json.dumps(obj))
        # A one-line string that is not JSON is a path; kubectl reports it clearly if missing.
        if isinstance(obj, os.PathLike) or ("\n" not in obj and not obj.lstrip().startswith("{")):
            return self.kubectl(*args, "-f", str(obj), *(["-R"] if Path(obj).is_dir() else []))
        return self.kubectl(*args, "-f", "-", input=obj)

    def install_crds(self, *paths: str | Path, timeout: float = 60.0) -> list[str]:
        """Apply CRD files/dirs and wait until each is Established and served.

        Returns the CRD names (e.g. ``pytorchjobs.kubeflow.org``).
        """
        names: list[str] = []
        for path in paths:
            out = self.apply(Path(path)).stdout
            # Lines look like "customresourcedefinition.apiextensions.k8s.io/<name> serverside-applied".
            names += [
                line.split()[0].split("/", 1)[1]
                for line in out.splitlines()
                if line.startswith("customresourcedefinition")
            ]
        if not names:
            return names
        deadline = time.monotonic() + timeout
        wait = ["wait", "--for=condition=Established", *[f"crd/{n}" for n in names]]
        # kubectl wait gives up at once on a CRD whose status has no conditions
        # yet (".status.conditions accessor error: <nil> is of the type <nil>"),
        # which a freshly applied one can show for a moment: ask again.
        while True:
            left = max(1, int(deadline - time.monotonic()))
            res = self.kubectl(*wait, f"--timeout={left}s", timeout=left + 10, check=False)
            if res.returncode == 0:
                break
            if "accessor error" not in res.stderr or time.monotonic() > deadline:
                raise KubectlError(res.returncode, res.args, res.stdout, res.stderr)
            time.sleep(0.2)
        # Established can precede the moment the new endpoints are served;
        # listing every new resource once proves they are.
        while self.kubectl("get", ",".join(names), "-A", "-o", "name", check=False).returncode != 0:
            if time.monotonic() > deadline:
                self.kubectl("get", ",".join(names), "-A", "-o", "name")  # raises, showing kubectl's error
            time.sleep(0.2)
        return names

    def create_namespace(self, name: str) -> None:
        """Create namespace ``name`` if it does not exist yet."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def serviceaccount_kubeconfig(
        self, namespace: str, name: str, path: Path | str | None = None, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount ``namespace/name``.

        Creates the namespace and ServiceAccount if missing, then gets a bound
        token from the TokenRequest API (``kubectl create token``), so whoever
        uses this kubeconfig has exactly that ServiceAccount's RBAC.
        """
        self.create_namespace(namespace)
        self.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
        token = self.kubectl(
            "create", "token", name, f"--namespace={namespace}", f"--duration={duration}"
        ).stdout.strip()
        out = Path(path) if path else self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        self.write_kubeconfig(
            out, {"token": token}, user=f"system:serviceaccount:{namespace}:{name}", namespace=namespace
        )
        return out

    def write_kubeconfig(
        self, path: Path, user_auth: Mapping[str, str], user: str = "admin", namespace: str = "default"
    ) -> None:
        # JSON is valid YAML, so every kubeconfig reader accepts it; credentials
        # are embedded so the file works from any working directory.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(self.pki / "ca.crt")},
                }
            ],
            "users": [{"name": user, "user": dict(user_auth)}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": namespace}}],
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
