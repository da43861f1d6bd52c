"""Kueue's controller manager next to a ControlPlane: real queueing, quotas and preemption of our jobs.

Built from its Go module like the other components (tools/versions.env pins
it), with its CRDs and webhook manifests from the same module source. What
differs from an in-cluster install, and why:

- its webhooks are registered by URL on loopback (no pod network), with the
  control plane's webhook CA and serving cert (``ControlPlane.webhook_certs``);
  only those of the enabled integrations (PyTorchJob, TrainJob) and of Kueue's own objects:
  the others' paths belong to frameworks that are not enabled, and with
  ``failurePolicy: Fail`` they would only add ways to fail;
- the CRDs are installed as the module ships them (no conversion webhook):
  everything here speaks v1beta2, the storage version;
- it runs as the cluster admin rather than its upstream ClusterRole;
- with its internal cert management off it reads its metrics serving cert from
  the fixed path /etc/kueue/metrics/certs (cmd/kueue/main.go, v0.17.0), which
  no setting moves: the same pair is written there when missing (as root, like CI);
- ``VisibilityOnDemand`` is off: its API server would want certs of its own.

Usage::

    kueue = Kueue(control_plane).start()
    ...
    kueue.stop()      # also removes its webhook configurations
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fsdp_api.ports import free_port

from .binaries import ensure_tools, kueue_source
from .control_plane import Component, ControlPlane
from .pki import b64
from .webhooks import delete_webhooks, register_webhooks

KUEUE = "kueue"
# The integrations our jobs need (one per spec.backend); Kueue needs no other (batch/job is only its default).
PYTORCHJOB_FRAMEWORK = "kubeflow.org/pytorchjob"
TRAINJOB_FRAMEWORK = "trainer.kubeflow.org/trainjob"
# Kueue's TrainJob reconciler also watches the JobSets of TrainJobs
# (pkg/controller/jobs/trainjob/trainjob_controller.go, Owns(&JobSet{})): without
# JobSet's CRD its cache never syncs and the whole manager exits after the sync
# timeout. So the integration is on only where JobSet is installed (TrainerV2 started).
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
CONFIGURATIONS = {"MutatingWebhookConfiguration": MUTATING, "ValidatingWebhookConfiguration": VALIDATING}
# The webhooks of config/components/webhook/manifests.yaml that concern our jobs and Kueue's own objects.
FRAMEWORK_WEBHOOKS = {
    PYTORCHJOB_FRAMEWORK: frozenset({"mpytorchjob.kb.io", "vpytorchjob.kb.io"}),
    TRAINJOB_FRAMEWORK: frozenset({"mtrainjob.kb.io", "vtrainjob.kb.io"}),
}
KUEUE_WEBHOOKS = frozenset(
    {
        "mclusterqueue.kb.io",
        "vclusterqueue.kb.io",
        "vcohort.kb.io",
        "mresourceflavor.kb.io",
        "vresourceflavor.kb.io",
        "mworkload.kb.io",
        "vworkload.kb.io",
    }
)


class Kueue:
    """One Kueue controller manager for a ControlPlane's cluster."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.cp = control_plane
        self.cluster = control_plane.cluster
        self.dir = control_plane.dir / "kueue"
        self.frameworks: tuple[str, ...] = (PYTORCHJOB_FRAMEWORK,)

    def start(self, timeout: float = 120.0, frameworks: tuple[str, ...] | None = None) -> Kueue:
        """Start it with ``frameworks`` (default: ours that the cluster can serve).

        Fewer frameworks is how Kueue 0.19 and later are installed by default
        (kubeflow.org/pytorchjob left out): a job of a left-out kind passes
        Kueue's webhooks untouched, as there.
        """
        ensure_tools([KUEUE])
        source = kueue_source()
        self.dir.mkdir(parents=True, exist_ok=True)
        jobset = self.cluster.kubectl("get", "crd", JOBSET_CRD, "--ignore-not-found", "-o", "name").stdout.strip()
        if frameworks is None:
            frameworks = (PYTORCHJOB_FRAMEWORK, TRAINJOB_FRAMEWORK) if jobset else (PYTORCHJOB_FRAMEWORK,)
        self.frameworks = frameworks
        self.cluster.install_crds(source / "config" / "components" / "crd" / "bases")
        pki = self.cp.webhook_certs()
        certs = self.cp.serving_certs(self.dir / "webhook-certs")
        if not (METRICS_CERT_DIR / "tls.crt").exists():
            self.cp.serving_certs(METRICS_CERT_DIR)
        webhook, metrics, health = free_port(), free_port(), free_port()
        config = self.dir / "config.yaml"
        config.write_text(
            yaml.safe_dump(self._config(certs, webhook, metrics, health, self.frameworks), sort_keys=False)
        )
        wanted = KUEUE_WEBHOOKS | frozenset().union(*(FRAMEWORK_WEBHOOKS[f] for f in self.frameworks))
        manifests = source / "config" / "components" / "webhook" / "manifests.yaml"
        register_webhooks(self.cluster, manifests, {}, CONFIGURATIONS, wanted, webhook, b64(pki / "webhook-ca.crt"))
        args = [f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}", "--zap-log-level=2"]
        self.cp.components[KUEUE] = Component(KUEUE, args, f"http://127.0.0.1:{health}/healthz")
        self.cp.start_component(KUEUE, timeout)
        return self

    def stop(self) -> None:
        self.cp.stop_component(KUEUE)
        self.cp.components.pop(KUEUE, None)
        delete_webhooks(self.cluster, CONFIGURATIONS)

    def logs(self, lines: int = 60) -> str:
        return self.cp.logs(KUEUE, lines)

    @staticmethod
    def _config(certs: Path, webhook: int, metrics: int, health: int, frameworks: tuple[str, ...]) -> dict[str, Any]:
        """The Configuration (config.kueue.x-k8s.io/v1beta2) of a local run; defaults for the rest."""
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "manageJobsWithoutQueueName": False,
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            # Its default is true, and one instance has nobody to elect.
            "leaderElection": {"leaderElect": False},
            "integrations": {"frameworks": list(frameworks)},
            "featureGates": {"VisibilityOnDemand": False},
        }
