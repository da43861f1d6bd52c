"""FSDPTraining and PyTorchJob bodies for the status tests, as the API server would hand them over."""

from __future__ import annotations

from typing import Any

from fsdp_api.status import FSDPTrainingStatus
from fsdp_operator.controller.status.compute import GENERATION_ANNOTATION, TrainingFacts

NOW = "2026-01-02T03:04:05Z"


def training(generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1", "generation": generation},
        "spec": {"image": "trainer:1", "model": {"preset": "tiny"}, "training": {"maxSteps": 10}, **spec},
    }


def facts(**spec: Any) -> TrainingFacts:
    return TrainingFacts.from_body(training(**spec))


def job(*conditions: dict[str, Any], generation: int = 1, suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "llama", "namespace": "ml", "annotations": {GENERATION_ANNOTATION: str(generation)}},
        "spec": {"runPolicy": {"suspend": suspend}},
        "status": {"conditions": list(conditions), **status},
    }


def conditions_of(status: FSDPTrainingStatus) -> dict[str, Any]:
    return {c.type: c for c in status.conditions}
