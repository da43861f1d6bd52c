"""Render an FSDPTraining into the Kubernetes objects that run it.

STUB: the renderer is being written; the signature below is the contract the
operator, the CLI, the kustomize overlay and the Helm chart rely on.
"""

from __future__ import annotations

from typing import Any

from .api import FSDPTraining


def render(training: FSDPTraining, *, set_owner: bool = False) -> list[dict[str, Any]]:
    """Objects in apply order: trainer ConfigMap, PyTorchJob, PodMonitor (if metrics).

    With ``set_owner`` each object carries an ownerReference to the
    FSDPTraining (its ``metadata.uid`` must be set), so deleting it cleans up.
    """
    raise NotImplementedError
