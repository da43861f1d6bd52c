"""Render an FSDPTraining into the Kubernetes objects that run it.

A pure function of the FSDPTraining: no cluster access, no clock, no
randomness, so the operator, ``fsdp-operator render`` and the tests see the
same objects. The checkpoint PVC is never rendered (it is the user's), so
deleting an FSDPTraining can never delete its checkpoints.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import API_VERSION, KIND, FSDPTraining

from .. import backends, naming
from .configmap import config_map, trainer_config
from .networkpolicy import network_policy
from .pod import pod_template
from .podmonitor import pod_monitor
from .trainjob_runtime import cluster_training_runtime

__all__ = ["cluster_training_runtime", "render", "trainer_config"]

EPHEMERAL_WARNING = (
    "spec.checkpoint.claimName is unset: checkpoints go to an emptyDir, survive container restarts "
    "but are lost when a pod is deleted or rescheduled, so such a restart starts training from scratch, "
    "and when the training finishes (the kubelet removes a finished pod's emptyDirs): nothing is left to export"
)


def checkpoint_annotations(training: FSDPTraining) -> dict[str, str]:
    claim, remote = training.spec.checkpoint.claim_name, training.spec.checkpoint.remote
    if remote:
        return {naming.CHECKPOINTS_ANNOTATION: f"{f'pvc/{claim}' if claim else 'emptyDir'}+{remote}"}
    if claim:
        return {naming.CHECKPOINTS_ANNOTATION: f"pvc/{claim}"}
    return {
        naming.CHECKPOINTS_ANNOTATION: "ephemeral",
        f"{naming.CHECKPOINTS_ANNOTATION}-warning": EPHEMERAL_WARNING,
    }


def owner_reference(training: FSDPTraining) -> dict[str, Any]:
    if not training.metadata.uid:
        raise ValueError("set_owner=True needs the FSDPTraining's metadata.uid (read it from the API server)")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": training.name,
        "uid": training.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def render(training: FSDPTraining, *, set_owner: bool = False) -> list[dict[str, Any]]:
    """Objects in apply order: ConfigMap (not with spec.command), the job, PodMonitor, NetworkPolicy.

    The job is spec.backend's (``backends``), rendered from the trainer pod template.

    With ``set_owner`` each object carries an ownerReference to the
    FSDPTraining (its ``metadata.uid`` must be set), so deleting it cleans up.
    """
    spec = training.spec
    name = training.name
    namespace = naming.namespace_of(training)
    annotations = checkpoint_annotations(training)
    # A script of your own (spec.command) has no trainer config to mount.
    objects = [] if spec.runs_own_script else [config_map(spec, name, namespace, annotations)]
    # The uid is the API server's: known where the operator renders what it applies.
    template = pod_template(spec, name, annotations, training.metadata.uid if set_owner else None)
    objects.append(backends.named(spec.backend).render_job(spec, name, namespace, annotations, template))
    if spec.metrics.enabled:
        objects.append(pod_monitor(spec, name, namespace))
    if spec.network_policy.enabled:
        objects.append(network_policy(spec, name, namespace))
    if set_owner:
        ref = owner_reference(training)
        for obj in objects:
            obj["metadata"]["ownerReferences"] = [dict(ref)]
    return objects
