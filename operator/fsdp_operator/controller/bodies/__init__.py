"""Typed reads of the raw bodies the watches deliver, for what the controller reads of them in many places.

Each view is a frozen dataclass parsed once from a body by its ``of``
classmethod, leniently: a missing field reads as empty (or as the API's
default), never as an error. ``meta``: metadata, ownerReferences and
conditions, which every kind shares; ``pods``, ``nodes``, ``workloads``: the
kinds the pod loop and the queue read. The training's own spec has its model
(fsdp_api) and ``TrainingFacts``; a job has ``backends.JobView``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.spec import MetricsSpec

from .events import EventView
from .meta import ConditionView, ObjectMeta, OwnerRef, by_type, conditions_of, first, int_of, metadata
from .nodes import NodeView, Taint
from .pods import ContainerState, ContainerStatus, PodView, Terminated, Waiting
from .workloads import NODE_LEVELS, TopologyAssignment, WorkloadView

Json = Mapping[str, Any]


def uid_of(obj: Json) -> str:
    return metadata(obj).get("uid", "")


def name_of(obj: Json) -> str:
    return str(metadata(obj).get("name", ""))


def live_pods(pods: Iterable[Json]) -> list[Json]:
    """The pods not being deleted (a deleted pod's replacement may already be listed)."""
    return [p for p in pods if not metadata(p).get("deletionTimestamp")]


def by_name(pods: Iterable[Json]) -> list[Json]:
    return sorted(pods, key=name_of)


def pod_views(pods: Iterable[Json]) -> list[PodView]:
    """The live pods (``live_pods``), each parsed once, in their order."""
    return [PodView.of(p) for p in live_pods(pods)]


@dataclass(frozen=True)
class MetricsView:
    """A training's spec.metrics: whether the trainer serves metrics, and on which port."""

    enabled: bool
    port: int

    @classmethod
    def of(cls, training: Json) -> MetricsView:
        metrics = (training.get("spec") or {}).get("metrics") or {}
        return cls(
            enabled=bool(metrics.get("enabled", True)),
            port=int(metrics.get("port", MetricsSpec.model_fields["port"].default)),
        )


__all__ = [
    "NODE_LEVELS",
    "ConditionView",
    "ContainerState",
    "ContainerStatus",
    "EventView",
    "Json",
    "MetricsView",
    "NodeView",
    "ObjectMeta",
    "OwnerRef",
    "PodView",
    "Taint",
    "Terminated",
    "TopologyAssignment",
    "Waiting",
    "WorkloadView",
    "by_name",
    "by_type",
    "conditions_of",
    "first",
    "int_of",
    "live_pods",
    "metadata",
    "name_of",
    "pod_views",
    "uid_of",
]
