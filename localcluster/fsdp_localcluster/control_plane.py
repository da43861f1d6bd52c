"""The rest of a control plane around a TestCluster: scheduler, controller-manager, training operator.

A TestCluster (``apiserver.py``) stores and validates objects but
nothing acts on them. ControlPlane adds, as child processes on loopback, built
from Go modules like the API server (``tools/build-binaries.sh``):

- ``kube-scheduler``: binds pods to nodes, or records why it cannot
  (``PodScheduled=False``, reason ``Unschedulable``);
- ``kube-controller-manager``: garbage collection (ownerReference cascades),
  ReplicaSets/Deployments, service accounts and their tokens, PV binding, node
  lifecycle...;
- the Kubeflow training operator v1 (``training-operator``, PyTorchJob only),
  running as its own ServiceAccount with its upstream ClusterRole, and with its
  validating webhook registered in the API server, so PyTorchJob defaulting,
  validation, pods, services and the ``PET_*``/``MASTER_*`` environment are
  upstream's own.

Each component authenticates like on a real cluster: the scheduler and the
controller-manager with client certificates for ``system:kube-scheduler`` and
``system:kube-controller-manager`` (the bootstrap RBAC roles the API server
creates), the controllers of the controller-manager with their own
ServiceAccounts, the training operator with a ServiceAccount token.

Nothing here runs pods: that is the node agent's job (``node_agent/``).

Typical use::

    with TestCluster() as cluster, ControlPlane(cluster) as cp:
        ...
        cp.kill("training-operator"); cp.start_component("training-operator")
"""

from __future__ import annotations

import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml
from fsdp_api.ports import free_port

from .apiserver import TestCluster, tail
from .binaries import ensure_tools, tool_path, training_operator_source
from .pki import OPENSSL_CNF, b64, ec_key, openssl, rsa_pkcs1_key, sign
from .processes import stop_process

SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
TRAINING_OPERATOR = "training-operator"
COMPONENTS = (SCHEDULER, CONTROLLER_MANAGER, TRAINING_OPERATOR)

# Where the training operator lives, as in its upstream manifests.
OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_SERVICE_ACCOUNT = "training-operator"
# Names hard-wired in training-operator's main.go / pkg/cert: the rotator keeps
# the CA and serving cert in this Secret and injects the CA into this webhook
# configuration; the server cert must be valid for the Service's DNS name.
WEBHOOK_SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
WEBHOOK_CA_NAME = "training-operator-ca"
WEBHOOK_DNS_NAME = f"training-operator.{OPERATOR_NAMESPACE}.svc"
# The cert rotator only checks that this file exists (upstream mounts the Secret
# there); the webhook server reads its certs from $TMPDIR/k8s-webhook-server/...
# so each ControlPlane serves its own certs and only this marker is shared.
ROTATOR_CERT_MARKER = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")

# The webhook's own CA and serving profiles, appended to the shared config
# (whose client profile signs the control plane's credentials).
_WEBHOOK_PROFILES = """\
[webhook_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectAltName = DNS:{ca_name}
[webhook_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:{dns_name}, IP:127.0.0.1
"""


class ComponentError(RuntimeError):
    """A control-plane component exited or did not become healthy; carries its log tail."""


@dataclass
class Component:
    """One control-plane process: how to start it and how to tell it is healthy."""

    name: str
    args: list[str]
    health_url: str
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ControlPlane:
    """kube-scheduler, kube-controller-manager and the training operator for one TestCluster."""

    def __init__(
        self,
        cluster: TestCluster,
        components: Sequence[str] = COMPONENTS,
        node_monitor_grace_period: str = "40s",
    ) -> None:
        unknown = set(components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components {sorted(unknown)}; known: {COMPONENTS}")
        self.cluster = cluster
        self.names = [c for c in COMPONENTS if c in components]
        self.dir = cluster.workdir / "control-plane"
        self.pki = self.dir / "pki"
        self.node_monitor_grace_period = node_monitor_grace_period
        self.components: dict[str, Component] = {}
        self.startup_seconds: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 120.0) -> ControlPlane:
        t0 = time.monotonic()
        ensure_tools(self.names)
        self.startup_seconds["tools"] = time.monotonic() - t0
        self.pki.mkdir(parents=True, exist_ok=True)
        (self.pki / "openssl.cnf").write_text(
            OPENSSL_CNF + _WEBHOOK_PROFILES.format(ca_name=WEBHOOK_CA_NAME, dns_name=WEBHOOK_DNS_NAME)
        )
        builders: dict[str, Callable[[], Component]] = {
            SCHEDULER: self._scheduler,
            CONTROLLER_MANAGER: self._controller_manager,
            TRAINING_OPERATOR: self._training_operator,
        }
        try:
            for name in self.names:
                t = time.monotonic()
                self.components[name] = builders[name]()
                self.start_component(name, timeout)
                self.startup_seconds[name] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component (SIGTERM, then SIGKILL after a grace period)."""
        for name in reversed(list(self.components)):
            self.stop_component(name)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_component(self, name: str, timeout: float = 120.0) -> None:
        """(Re)start one component and wait until its health endpoint answers."""
        comp = self.components[name]
        if comp.running:
            return
        if comp.proc is not None:
            comp.restarts += 1
        log: IO[bytes] = (self.dir / f"{name}.log").open("ab")
        try:
            comp.proc = subprocess.Popen(
                [str(tool_path(name, build=False)), *comp.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **comp.env},
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not theirs
            )
        finally:
            log.close()
        self._wait_healthy(comp, timeout)

    def stop_component(self, name: str, grace: float = 15.0) -> None:
        comp = self.components.get(name)
        if comp is None or not comp.running:
            return
        stop_process(comp.proc, grace)

    def kill(self, name: str) -> None:
        """SIGKILL a component, as a crash or an OOM kill would (no clean shutdown)."""
        comp = self.components[name]
        if comp.running:
            assert comp.proc is not None
            comp.proc.kill()
            comp.proc.wait()

    def logs(self, name: str | None = None, lines: int = 40) -> str:
        names = [name] if name else list(self.components)
        return "\n".join(
            f"----- {n}.log (last {lines} lines) -----\n{tail(self.dir / f'{n}.log', lines)}" for n in names
        )

    def _wait_healthy(self, comp: Component, timeout: float) -> None:
        # Their serving certs are self-signed (scheduler, controller-manager) and
        # /healthz is open to anyone, so the probe does not verify or authenticate.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert comp.proc is not None
            if comp.proc.poll() is not None:
                raise ComponentError(f"{comp.name} exited with {comp.proc.returncode}\n{self.logs(comp.name)}")
            try:
                with urllib.request.urlopen(comp.health_url, timeout=5, context=ctx) as r:
                    last = r.read().decode()
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError) as e:
                last = str(e)
            time.sleep(0.25)
        raise ComponentError(
            f"{comp.name} not healthy after {timeout}s at {comp.health_url}: {last}\n{self.logs(comp.name)}"
        )

    # ------------------------------------------------------------- credentials

    def _client_kubeconfig(self, name: str, subject: str) -> Path:
        """A kubeconfig with a client certificate for ``subject``, signed by the cluster CA."""
        key, crt = self.pki / f"{name}.key", self.pki / f"{name}.crt"
        if not crt.exists():
            ec_key(key)
            cpki = self.cluster.pki
            sign(self.pki / "openssl.cnf", key, subject, "client", cpki / "ca.crt", cpki / "ca.key", crt)
        path = self.dir / f"{name}.kubeconfig"
        self.cluster.write_kubeconfig(
            path, {"client-certificate-data": b64(crt), "client-key-data": b64(key)}, user=name
        )
        return path

    @staticmethod
    def _serving_args(port: int, kubeconfig: Path) -> list[str]:
        # No delegated authn/authz kubeconfigs: the test API server has no
        # front-proxy (requestheader) CA for them to look up, and the only
        # endpoint used, /healthz, is always allowed anyway.
        return [
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ]

    # --------------------------------------------------------------- components

    def _scheduler(self) -> Component:
        kubeconfig = self._client_kubeconfig("kube-scheduler", "/CN=system:kube-scheduler")
        port = free_port()
        return Component(SCHEDULER, self._serving_args(port, kubeconfig), f"https://127.0.0.1:{port}/healthz")

    def _controller_manager(self) -> Component:
        kubeconfig = self._client_kubeconfig("kube-controller-manager", "/CN=system:kube-controller-manager")
        port = free_port()
        cpki = self.cluster.pki
        args = [
            *self._serving_args(port, kubeconfig),
            # Each controller acts as its own ServiceAccount (kube-system/<controller>),
            # whose tokens the token controller signs with the API server's SA key.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={cpki / 'sa.key'}",
            f"--root-ca-file={cpki / 'ca.crt'}",
            f"--cluster-signing-cert-file={cpki / 'ca.crt'}",
            f"--cluster-signing-key-file={cpki / 'ca.key'}",
            # The local node agent renews its Leases every 10 s; 40 s without one
            # marks a node NotReady (upstream's default is 50 s).
            f"--node-monitor-grace-period={self.node_monitor_grace_period}",
            # Garbage collection and the other defaults, plus nothing cloud-specific.
            "--controllers=*",
        ]
        return Component(CONTROLLER_MANAGER, args, f"https://127.0.0.1:{port}/healthz")

    def _training_operator(self) -> Component:
        kubeconfig = self._install_training_operator()
        metrics, probe, webhook = free_port(), free_port(), free_port()
        self._install_webhook(webhook)
        # controller-runtime's webhook server reads its certs from
        # $TMPDIR/k8s-webhook-server/serving-certs: give this operator its own.
        tmp = self.dir / "training-operator-tmp"
        self.serving_certs(tmp / "k8s-webhook-server" / "serving-certs")
        if not ROTATOR_CERT_MARKER.exists():
            ROTATOR_CERT_MARKER.parent.mkdir(parents=True, exist_ok=True)
            ROTATOR_CERT_MARKER.write_text("# existence marker for the training operator's cert rotator\n")
        args = [
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--webhook-server-port={webhook}",
            "--leader-elect=false",
            "--zap-log-level=info",
        ]
        env = {"KUBECONFIG": str(kubeconfig), "MY_POD_NAMESPACE": OPERATOR_NAMESPACE, "TMPDIR": str(tmp)}
        self.webhook_port = webhook
        return Component(TRAINING_OPERATOR, args, f"http://127.0.0.1:{probe}/readyz", env=env)

    def _install_training_operator(self) -> Path:
        """Upstream's ClusterRole, bound to a ServiceAccount; returns a kubeconfig acting as it."""
        rbac = training_operator_source() / "manifests" / "base" / "rbac" / "role.yaml"
        docs = [d for d in yaml.safe_load_all(rbac.read_text()) if d]
        self.cluster.create_namespace(OPERATOR_NAMESPACE)
        for doc in docs:
            self.cluster.apply(doc)
        role = next(d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole")
        self.cluster.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "training-operator"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [
                    {"kind": "ServiceAccount", "name": OPERATOR_SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE}
                ],
            }
        )
        return self.cluster.serviceaccount_kubeconfig(
            OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, path=self.dir / "training-operator.kubeconfig"
        )

    def webhook_certs(self) -> Path:
        """The webhook CA and a serving cert for 127.0.0.1 (and the training operator's Service name), made once.

        Every webhook server of this control plane (the training operator's,
        Kueue's) serves this pair: the API server calls them by URL on loopback.
        Returns the directory holding webhook-{ca,tls}.{crt,key}.
        """
        p, cnf = self.pki, self.pki / "openssl.cnf"
        if not (p / "webhook-tls.crt").exists():
            rsa_pkcs1_key(p / "webhook-ca.key")
            openssl(
                "req",
                "-x509",
                "-new",
                "-config",
                str(cnf),
                "-extensions",
                "webhook_ca",
                "-key",
                str(p / "webhook-ca.key"),
                "-subj",
                f"/O=training-operator/CN={WEBHOOK_CA_NAME}",
                "-days",
                "3650",
                "-out",
                str(p / "webhook-ca.crt"),
            )
            rsa_pkcs1_key(p / "webhook-tls.key")
            sign(
                cnf,
                p / "webhook-tls.key",
                f"/CN={WEBHOOK_DNS_NAME}",
                "webhook_server",
                p / "webhook-ca.crt",
                p / "webhook-ca.key",
                p / "webhook-tls.crt",
            )
        return p

    def serving_certs(self, dest: Path) -> Path:
        """``dest`` holding tls.crt and tls.key of the webhook serving cert (``webhook_certs``), for one server."""
        pki = self.webhook_certs()
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (dest / name).write_bytes((pki / f"webhook-{name}").read_bytes())
        return dest

    def _install_webhook(self, port: int) -> None:
        """Serving certs (in the operator's Secret) and the ValidatingWebhookConfiguration.

        Upstream points the webhook at a Service; with no pod network the API
        server calls the operator on loopback by URL instead, so the serving
        cert carries IP:127.0.0.1 besides the Service DNS name the rotator
        checks (a cert it finds valid it keeps rather than regenerates).
        """
        p = self.webhook_certs()
        files = {
            "ca.crt": "webhook-ca.crt",
            "ca.key": "webhook-ca.key",
            "tls.crt": "webhook-tls.crt",
            "tls.key": "webhook-tls.key",
        }
        self.cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": WEBHOOK_SECRET, "namespace": OPERATOR_NAMESPACE},
                "data": {k: b64(p / v) for k, v in files.items()},
            }
        )
        # Only the PyTorchJob webhook of upstream's configuration: the others'
        # schemes are not enabled, and their paths would not be served.
        self.cluster.apply(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": WEBHOOK_CONFIGURATION},
                "webhooks": [
                    {
                        "name": "validator.pytorchjob.training-operator.kubeflow.org",
                        "admissionReviewVersions": ["v1"],
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/validate-kubeflow-org-v1-pytorchjob",
                            "caBundle": b64(p / "webhook-ca.crt"),
                        },
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "timeoutSeconds": 10,
                        "rules": [
                            {
                                "apiGroups": ["kubeflow.org"],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["pytorchjobs"],
                            }
                        ],
                    }
                ],
            }
        )
