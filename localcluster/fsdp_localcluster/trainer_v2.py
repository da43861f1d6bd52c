"""Kubeflow Trainer v2 and JobSet next to a ControlPlane: real TrainJobs, run as JobSets of Indexed Jobs.

Both controller managers are built from their Go modules like the other
components (``tools/versions.env`` pins ``TRAINER_VERSION`` and
``JOBSET_VERSION``), with their CRDs and webhook manifests from the same module
sources. A TrainJob goes the upstream way: Trainer's webhooks default and
validate it, its controller renders the (Cluster)TrainingRuntime into a JobSet
with the ``PET_*`` environment of its torch plugin, the JobSet controller makes
the headless Service and the Indexed Jobs, kube-controller-manager's Job
controller the pods (``spec.hostname``/``spec.subdomain``), the node agent runs
them, and the statuses flow back up to the TrainJob's ``Complete``/``Failed``.

What differs from an in-cluster install, and why:

- the webhooks are registered by URL on loopback (no pod network), with the
  control plane's webhook CA and serving cert (``ControlPlane.webhook_certs``),
  under upstream's configuration names and with upstream's kustomize patches
  (object selectors) applied; ``timeoutSeconds`` is 10;
- their own cert management is off (it would write a Secret and patch the
  webhook configurations for a Service that does not exist here): JobSet reads
  the serving pair from ``webhook.certDir``; Trainer's Configuration has no such
  field, so its controller-runtime webhook server reads the default
  ``$TMPDIR/k8s-webhook-server/serving-certs``, and the process gets a private
  ``TMPDIR`` holding the pair;
- metrics are off (``bindAddress: "0"``): upstream serves them over TLS with
  authn/authz delegation, which nothing here scrapes;
- no leader election (one instance each): JobSet's is on by default and is
  turned off; Trainer's is off unless its Configuration sets it;
- both run as the cluster admin rather than their upstream ClusterRoles;
- the Trainer needs the JobSet CRD to exist when it starts (it checks the
  RESTMapping once, pkg/runtime/framework/plugins/jobset/jobset.go, and would
  otherwise never watch JobSets): ``TrainerV2.start`` starts JobSet first.

Usage::

    trainer = TrainerV2(control_plane).start()   # JobSet first, then Trainer
    ...
    trainer.stop()   # both stopped, their webhook configurations removed
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.ports import free_port

from .binaries import ensure_tools, jobset_source, trainer_source
from .control_plane import Component, ControlPlane
from .pki import b64
from .wait import wait_for
from .webhooks import delete_webhooks, register_webhooks

JOBSET = "jobset"
TRAINER = "trainer-controller-manager"
# The TrainJob status server (Trainer v2.3, alpha): its feature gate, the Service its URL
# names (namespace, config's certManagement.webhookServiceName default) and the Secret the
# plugin reads the CA from (pkg/apis/config/v1alpha1/defaults.go), the fixed serving-cert
# folder (pkg/util/cert/cert.go) and the in-cluster token path (pkg/statusserver/auth.go).
STATUS_GATE = "TrainJobStatus"
STATUS_SERVICE = ("kubeflow-system", "kubeflow-trainer-controller-manager")
WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"
STATUS_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
HOST_SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")

MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"

# The configuration names of an upstream install (JobSet: pkg/util/cert/cert.go;
# Trainer: cmd/trainer-controller-manager/main.go and its kustomize patches).
JOBSET_WEBHOOK_CONFIGURATIONS = {
    MUTATING: "jobset-mutating-webhook-configuration",
    VALIDATING: "jobset-validating-webhook-configuration",
}
TRAINER_WEBHOOK_CONFIGURATIONS = {
    MUTATING: "defaulter.trainer.kubeflow.org",
    VALIDATING: "validator.trainer.kubeflow.org",
}
# Every webhook of config/components/webhook/manifests.yaml: the JobSet ones
# default (Indexed completion, DNS hostnames, ...) and validate JobSets; the pod
# ones (only for pods labelled with a JobSet name) carry exclusive placement.
JOBSET_WEBHOOKS = frozenset({"mjobset.kb.io", "vjobset.kb.io", "mpod.kb.io", "vpod.kb.io"})
# Every webhook of manifests/base/webhook/manifests.yaml.
TRAINER_WEBHOOKS = frozenset(
    {
        "defaulter.trainjob.trainer.kubeflow.org",
        "validator.trainjob.trainer.kubeflow.org",
        "validator.clustertrainingruntime.trainer.kubeflow.org",
        "validator.trainingruntime.trainer.kubeflow.org",
    }
)


class JobSet:
    """One JobSet controller manager for a ControlPlane's cluster."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.cp = control_plane
        self.cluster = control_plane.cluster
        self.dir = control_plane.dir / JOBSET
        self.startup_seconds = 0.0

    def start(self, timeout: float = 120.0) -> JobSet:
        t = time.monotonic()
        ensure_tools([JOBSET])
        source = jobset_source()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster.install_crds(source / "config" / "components" / "crd" / "bases")
        pki = self.cp.webhook_certs()
        certs = self.cp.serving_certs(self.dir / "webhook-certs")
        webhook, health = free_port(), free_port()
        config = self.dir / "config.yaml"
        config.write_text(yaml.safe_dump(self._config(certs, webhook, health), sort_keys=False))
        hooks = source / "config" / "components" / "webhook"
        register_webhooks(
            self.cluster,
            hooks / "manifests.yaml",
            {
                MUTATING: hooks / "patches" / "mutating-patch.yaml",
                VALIDATING: hooks / "patches" / "validating-patch.yaml",
            },
            JOBSET_WEBHOOK_CONFIGURATIONS,
            JOBSET_WEBHOOKS,
            webhook,
            b64(pki / "webhook-ca.crt"),
        )
        args = [f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}", "--zap-log-level=info"]
        # /readyz answers once the webhook server listens (main.go), so JobSets can be created.
        self.cp.components[JOBSET] = Component(JOBSET, args, f"http://127.0.0.1:{health}/readyz")
        self.cp.start_component(JOBSET, timeout)
        self.startup_seconds = time.monotonic() - t
        return self

    def stop(self) -> None:
        self.cp.stop_component(JOBSET)
        self.cp.components.pop(JOBSET, None)
        delete_webhooks(self.cluster, JOBSET_WEBHOOK_CONFIGURATIONS)

    def logs(self, lines: int = 60) -> str:
        return self.cp.logs(JOBSET, lines)

    @staticmethod
    def _config(certs: Path, webhook: int, health: int) -> dict[str, Any]:
        """The Configuration (config.jobset.x-k8s.io/v1alpha1, api/config/v1alpha1) of a local run."""
        return {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
            # "0" turns the metrics server off; with cert management off its
            # cert dir would default to /tmp/k8s-metrics-server/serving-certs.
            "metrics": {"bindAddress": "0", "certDir": str(certs)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            # Defaulted to true (RecommendedDefaultLeaderElectionConfiguration).
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        }


class TrainerV2:
    """Kubeflow Trainer v2's controller manager, with the JobSet controller it runs TrainJobs on."""

    def __init__(self, control_plane: ControlPlane, *, status_server: bool = False) -> None:
        """``status_server``: the alpha TrainJobStatus gate on, its status server on loopback (see
        ``_prepare_status_server``); pods reach it at ``status_service`` (the node agent's
        ``serve_from_host``)."""
        self.cp = control_plane
        self.cluster = control_plane.cluster
        self.dir = control_plane.dir / TRAINER
        self.jobset = JobSet(control_plane)
        self.startup_seconds: dict[str, float] = {}
        self.status_port = free_port() if status_server else None

    def start(self, timeout: float = 120.0) -> TrainerV2:
        ensure_tools([JOBSET, TRAINER])  # one script run builds whichever is missing
        try:
            self.jobset.start(timeout)
            self.startup_seconds[JOBSET] = self.jobset.startup_seconds
            t = time.monotonic()
            self._start_trainer(timeout)
            self.startup_seconds[TRAINER] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.cp.stop_component(TRAINER)
        self.cp.components.pop(TRAINER, None)
        delete_webhooks(self.cluster, TRAINER_WEBHOOK_CONFIGURATIONS)
        self.jobset.stop()

    def __enter__(self) -> TrainerV2:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self, lines: int = 60) -> str:
        return self.cp.logs(TRAINER, lines) + "\n" + self.jobset.logs(lines)

    def _start_trainer(self, timeout: float) -> None:
        source = trainer_source()
        self.dir.mkdir(parents=True, exist_ok=True)
        crds = source / "manifests" / "base" / "crds"
        # Not the directory: it also holds a kustomization.yaml, which is no manifest.
        self.cluster.install_crds(*sorted(crds.glob("trainer.kubeflow.org_*.yaml")))
        pki = self.cp.webhook_certs()
        # No certDir setting (pkg/apis/config/v1alpha1): controller-runtime's
        # default, $TMPDIR/k8s-webhook-server/serving-certs, private to this process.
        tmp = self.dir / "tmp"
        self.cp.serving_certs(tmp / "k8s-webhook-server" / "serving-certs")
        webhook, health = free_port(), free_port()
        config = self.dir / "config.yaml"
        settings = self._config(webhook, health)
        if self.status_port is not None:
            settings |= {"featureGates": {STATUS_GATE: True}, "statusServer": {"port": self.status_port}}
            self._prepare_status_server(pki)
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        hooks = source / "manifests" / "base" / "webhook"
        register_webhooks(
            self.cluster,
            hooks / "manifests.yaml",
            {MUTATING: hooks / "patch_mutating.yaml", VALIDATING: hooks / "patch_validating.yaml"},
            TRAINER_WEBHOOK_CONFIGURATIONS,
            TRAINER_WEBHOOKS,
            webhook,
            b64(pki / "webhook-ca.crt"),
        )
        args = [f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}", "--zap-log-level=info"]
        # /readyz answers once the webhook server listens (main.go setupProbeEndpoints).
        self.cp.components[TRAINER] = Component(
            TRAINER, args, f"http://127.0.0.1:{health}/readyz", env={"TMPDIR": str(tmp)}
        )
        try:
            self.cp.start_component(TRAINER, timeout)
            if self.status_port is not None:
                wait_for(lambda: _listening(self.status_port), timeout, "the TrainJob status server listening")
        finally:
            HOST_SA_TOKEN.unlink(missing_ok=True)  # read once, at the status server's start

    def _prepare_status_server(self, pki: Path) -> None:
        """What Trainer's status server and its TrainJobStatus plugin expect of an in-cluster install.

        - Its serving cert at the fixed ``/tmp/k8s-webhook-server/serving-certs``
          (pkg/util/cert: ``certDir``, not under $TMPDIR): ours is valid for
          127.0.0.1, which the pods dial once the node agent resolves the Service.
        - The CA in the webhook Secret of its namespace, which the plugin copies
          into each TrainJob's ``<name>-tls-config`` ConfigMap for the pods.
        - A service-account token at the in-cluster path, from which it reads the
          cluster's token issuer at start (pkg/statusserver/auth.go); removed as
          soon as the server listens, since in-cluster clients on this host would
          take it for theirs.
        """
        STATUS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (STATUS_CERT_DIR / name).write_bytes((pki / f"webhook-{name}").read_bytes())
        namespace, name = STATUS_SERVICE
        self.cluster.create_namespace(namespace)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": namespace},
            "data": {"ca.crt": b64(pki / "webhook-ca.crt")},
        }
        self.cluster.apply(secret)
        if HOST_SA_TOKEN.exists():
            raise RuntimeError(f"{HOST_SA_TOKEN} exists: this host runs in a pod, whose token the harness keeps")
        self.cluster.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
        )
        token = self.cluster.kubectl("create", "token", name, f"--namespace={namespace}").stdout.strip()
        HOST_SA_TOKEN.parent.mkdir(parents=True, exist_ok=True)
        HOST_SA_TOKEN.write_text(token)

    @staticmethod
    def _config(webhook: int, health: int) -> dict[str, Any]:
        """The Configuration (config.trainer.kubeflow.org/v1alpha1) of a local run; defaults for the rest.

        No ``leaderElection``: without it the manager does not elect
        (pkg/config/config.go only sets it from the file).
        """
        return {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": webhook, "host": "127.0.0.1"},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "certManagement": {"enable": False},
        }


def _listening(port: int | None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port or 0), timeout=1):
            return True
    except OSError:
        return False
