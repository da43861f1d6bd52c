"""A two-node FSDPTraining and the objects the operator renders for it, for the render tests."""

from __future__ import annotations

import copy
from typing import Any

from fsdp_api import FSDPTraining
from fsdp_operator.render import render

Obj = dict[str, Any]

BASE: Obj = {
    "apiVersion": "training.fsdp.dev/v1alpha1",
    "kind": "FSDPTraining",
    "metadata": {"name": "llama", "namespace": "team-a", "uid": "0b6c5a8e-2f0e-4c52-9d0b-6f1f3c1d9a11"},
    "spec": {
        "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
        "model": {"preset": "llama3.2-1b"},
        "training": {"maxSteps": 1000, "seqLen": 2048},
        "resources": {"nodes": 2, "gpusPerNode": 8},
    },
}


def deep_merge(base: Obj, extra: Obj) -> Obj:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def training(**spec: Any) -> FSDPTraining:
    return FSDPTraining.model_validate(deep_merge(BASE, {"spec": spec}))


def objects(**spec: Any) -> dict[str, Obj]:
    return {o["kind"]: o for o in render(training(**spec))}


def job_of(**spec: Any) -> Obj:
    return objects(**spec)["PyTorchJob"]
