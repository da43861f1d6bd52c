"""The parts every watched body shares: its metadata, its ownerReferences, its conditions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Json = Mapping[str, Any]


def metadata(obj: Json) -> Json:
    return obj.get("metadata") or {}


def int_of(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class OwnerRef:
    """One ownerReference of an object."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool
    # The reference as the body holds it, for what passes it on unchanged.
    body: Json = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, ref: Json) -> OwnerRef:
        return cls(
            api_version=str(ref.get("apiVersion") or ""),
            kind=str(ref.get("kind") or ""),
            name=str(ref.get("name") or ""),
            uid=str(ref.get("uid") or ""),
            controller=bool(ref.get("controller")),
            body=ref,
        )


@dataclass(frozen=True)
class ObjectMeta:
    """An object's metadata, as the controller reads it; a missing field reads as empty."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: str = ""
    deletion_timestamp: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner_references: tuple[OwnerRef, ...] = ()

    @classmethod
    def of(cls, obj: Json) -> ObjectMeta:
        """The metadata of ``obj`` (a whole body)."""
        meta = metadata(obj)
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            generation=int_of(meta.get("generation")),
            creation_timestamp=str(meta.get("creationTimestamp") or ""),
            deletion_timestamp=str(meta.get("deletionTimestamp") or ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            owner_references=tuple(OwnerRef.of(r) for r in meta.get("ownerReferences") or []),
        )

    @property
    def deleting(self) -> bool:
        return bool(self.deletion_timestamp)


@dataclass(frozen=True)
class ConditionView:
    """One entry of a status.conditions list (a pod's, a node's, a Workload's); missing fields read as ""."""

    type: str
    status: str
    reason: str
    message: str
    # The condition as the body holds it, for what passes it on unchanged.
    body: Json = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, cond: Json) -> ConditionView:
        return cls(
            type=str(cond.get("type") or ""),
            status=str(cond.get("status") or ""),
            reason=str(cond.get("reason") or ""),
            message=str(cond.get("message") or ""),
            body=cond,
        )


def conditions_of(status: Json) -> tuple[ConditionView, ...]:
    """The conditions of a status (``status.conditions``), in their order."""
    return tuple(ConditionView.of(c) for c in status.get("conditions") or [])


def first(conditions: Iterable[ConditionView], cond_type: str) -> ConditionView | None:
    """The first condition of ``cond_type``, if any."""
    return next((c for c in conditions if c.type == cond_type), None)


def by_type(conditions: Iterable[ConditionView]) -> dict[str, ConditionView]:
    """The conditions by type (of two of one type, the later)."""
    return {c.type: c for c in conditions}
