"""Shared by the operator tests: the example files, and the Kubeflow webhook's rules.

``valid_example`` and ``invalid_example`` parametrize a test over examples/*.yaml
and examples/invalid/*.yaml. ``kubeflow_webhook_errors`` checks a PyTorchJob
against the training operator's validating webhook, which the test cluster
does not run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api import FSDPTraining

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# The FSDPTraining of examples/your-own-script sits beside its script and kustomization.
VALID_EXAMPLES = sorted([*EXAMPLES.glob("*.yaml"), EXAMPLES / "your-own-script" / "fsdptraining.yaml"])
INVALID_EXAMPLES = sorted((EXAMPLES / "invalid").glob("*.yaml"))

_EXPECT = re.compile(r"^# (expect|expect-apiserver): (\S+) (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class InvalidExample:
    """An examples/invalid file and the error it must produce.

    ``# expect: <field path> <message>`` is what pydantic (``fsdp-operator
    validate``) says; ``# expect-apiserver:`` overrides it for the API server
    where the wording is the server's own (enums, unknown fields). Files named
    cel-* break a rule of api/rules.py, whose message both sides share verbatim.
    """

    path: Path
    field: str
    message: str
    apiserver_field: str
    apiserver_message: str

    def body(self) -> dict[str, Any]:
        return yaml.safe_load(self.path.read_text())


def read_invalid_example(path: Path) -> InvalidExample:
    found = {kind: (field, message.strip()) for kind, field, message in _EXPECT.findall(path.read_text())}
    assert "expect" in found, f"{path} needs a '# expect: <field path> <message>' line"
    field, message = found["expect"]
    api_field, api_message = found.get("expect-apiserver", found["expect"])
    return InvalidExample(path, field, message, api_field, api_message)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "valid_example" in metafunc.fixturenames:
        metafunc.parametrize("valid_example", VALID_EXAMPLES, ids=[p.stem for p in VALID_EXAMPLES])
    if "invalid_example" in metafunc.fixturenames:
        items = [read_invalid_example(p) for p in INVALID_EXAMPLES]
        metafunc.parametrize("invalid_example", items, ids=[p.stem for p in INVALID_EXAMPLES])


def load_training(path: Path) -> FSDPTraining:
    return FSDPTraining.model_validate(yaml.safe_load(path.read_text()))


@pytest.fixture
def training_from() -> Callable[[Path], FSDPTraining]:
    return load_training


@pytest.fixture
def invalid_examples() -> list[InvalidExample]:
    """All examples/invalid files, for tests about the set as a whole."""
    return [read_invalid_example(p) for p in INVALID_EXAMPLES]


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
