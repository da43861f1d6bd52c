"""What runs an FSDPTraining's pods (spec.backend): one module per backend, one registry.

Each backend implements ``base.Backend``; the renderer, the controller and the
watches look a backend up here (by spec.backend, or by a job's kind) and loop
over ``REGISTRY`` instead of branching on its name. A new backend is one module
and one entry below (docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_api.contract import PYTORCHJOB

from .base import FAILED_CREATE_POD, Backend, rendezvous_endpoint
from .pytorchjob import PyTorchJobBackend
from .trainjob import TrainJobBackend
from .view import JobCondition, JobView

REGISTRY: dict[str, Backend] = {b.ref.name: b for b in (PyTorchJobBackend(), TrainJobBackend())}
BY_KIND: dict[str, Backend] = {b.ref.kind: b for b in REGISTRY.values()}
# What an FSDPTraining without spec.backend runs as (the API server defaults it; older objects lack it).
DEFAULT: Backend = REGISTRY[PYTORCHJOB.name]


def named(name: str | None) -> Backend:
    """The backend of a spec.backend value; the default one for an unset or unknown value."""
    return REGISTRY.get(name or "", DEFAULT)


def of_training(body: Mapping[str, Any]) -> Backend:
    """The backend of an FSDPTraining body (its spec.backend)."""
    return named((body.get("spec") or {}).get("backend"))


def of_kind(kind: str | None) -> Backend:
    """The backend whose job has ``kind``; the default one for a job without a kind."""
    return BY_KIND.get(kind or "", DEFAULT)


def job_view(job: Mapping[str, Any] | JobView) -> JobView:
    """The typed view of a job in the Kubeflow v1 form (``reconcile.trim_job``'s); a view as it is."""
    return job if isinstance(job, JobView) else JobView.of(job, DEFAULT.ref.kind)


__all__ = [
    "BY_KIND",
    "DEFAULT",
    "FAILED_CREATE_POD",
    "REGISTRY",
    "Backend",
    "JobCondition",
    "JobView",
    "job_view",
    "named",
    "of_kind",
    "of_training",
    "rendezvous_endpoint",
]
