"""Shared by the operator tests: the Kubeflow webhook's rules (the examples are tests/support/examples.py).

``kubeflow_webhook_errors`` checks a PyTorchJob against the training
operator's validating webhook, which the test cluster does not run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

# --- the Kubeflow training operator's validating webhook (v1.9.4) -------------------
# pkg/webhooks/pytorch/pytorchjob_webhook.go and pkg/common/util/webhooks.go.

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_REPLICA_TYPES = ("Master", "Worker")
_MANAGED_BY = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")


def _webhook_errors(job: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    name = job.get("metadata", {}).get("name", "")
    if not _DNS1035.match(name) or len(name) > 63:
        errors.append("metadata.name: should match a DNS-1035 label")
    spec = job.get("spec", {})
    managed_by = spec.get("runPolicy", {}).get("managedBy")
    if managed_by is not None and managed_by not in _MANAGED_BY:
        errors.append("spec.runPolicy.managedBy: Unsupported value")
    replicas = spec.get("pytorchReplicaSpecs")
    if spec.get("elasticPolicy") is not None:
        if "Worker" not in (replicas or {}):
            errors.append("spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used")
        if "nProcPerNode" in spec["elasticPolicy"] and "nprocPerNode" in spec:
            errors.append("spec.elasticPolicy.nProcPerNode: must not be used with spec.nprocPerNode")
    if not replicas:
        errors.append("spec.pytorchReplicaSpecs: must be required")
        return errors
    for rtype, rspec in replicas.items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in _REPLICA_TYPES:
            errors.append(f"{path}: Unsupported value: {rtype!r}")
        containers = (rspec or {}).get("template", {}).get("spec", {}).get("containers") or []
        if not containers:
            errors.append(f"{path}.template.spec.containers: must be specified")
        for i, c in enumerate(containers):
            if not c.get("image"):
                errors.append(f"{path}.template.spec.containers[{i}].image: must be required")
        if not any(c.get("name") == "pytorch" for c in containers):
            errors.append(f"{path}.template.spec.containers: must have at least one container with name pytorch")
        count = (rspec or {}).get("replicas")
        if rtype == "Master" and count != 1:
            errors.append(f"{path}.replicas: must be 1")
        elif rtype != "Master" and count is not None and count < 1:
            errors.append(f"{path}.replicas: must be at least 1")
    return errors


@pytest.fixture
def kubeflow_webhook_errors() -> Callable[[dict[str, Any]], list[str]]:
    """``errors(job)``: the webhook's complaints about a PyTorchJob dict ([] when it admits it)."""
    return _webhook_errors
