"""Typed reads of the raw bodies the watches deliver, for what the controller reads of them in many places."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.spec import MetricsSpec

Json = Mapping[str, Any]


def metadata(obj: Json) -> Json:
    return obj.get("metadata") or {}


def uid_of(obj: Json) -> str:
    return metadata(obj).get("uid", "")


def name_of(obj: Json) -> str:
    return str(metadata(obj).get("name", ""))


def live_pods(pods: Iterable[Json]) -> list[Json]:
    """The pods not being deleted (a deleted pod's replacement may already be listed)."""
    return [p for p in pods if not metadata(p).get("deletionTimestamp")]


def by_name(pods: Iterable[Json]) -> list[Json]:
    return sorted(pods, key=name_of)


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
