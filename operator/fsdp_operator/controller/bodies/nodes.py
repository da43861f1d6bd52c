"""A node as the node check reads it: its labels and annotations, its conditions, its taints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .meta import ConditionView, ObjectMeta, conditions_of

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Taint:
    """One of a node's spec.taints; ``body`` is the taint as listed, for a patch that writes the list back."""

    key: str
    value: str
    effect: str
    body: Json = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, taint: Json) -> Taint:
        return cls(
            key=str(taint.get("key") or ""),
            value=str(taint.get("value") or ""),
            effect=str(taint.get("effect") or ""),
            body=taint,
        )


@dataclass(frozen=True)
class NodeView:
    """A node, parsed once from its body; a missing field reads as empty."""

    meta: ObjectMeta
    conditions: tuple[ConditionView, ...] = ()
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False

    @classmethod
    def of(cls, node: Json) -> NodeView:
        spec = node.get("spec") or {}
        return cls(
            meta=ObjectMeta.of(node),
            conditions=conditions_of(node.get("status") or {}),
            taints=tuple(Taint.of(t) for t in spec.get("taints") or []),
            unschedulable=bool(spec.get("unschedulable")),
        )

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.labels

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.meta.annotations

    def has_taint(self, key: str) -> bool:
        return any(t.key == key for t in self.taints)

    def taints_without(self, key: str) -> list[Json]:
        """The node's taints as listed, less those with ``key``."""
        return [t.body for t in self.taints if t.key != key]
