"""A Kueue Workload (v1beta2, Kueue v0.17.0) as the controller reads it: active, conditions, topology assignment.

Also ``trimmed``: the parts of a Workload the operator keeps in memory
(``Runtime.workloads``), a body again, which ``WorkloadView.of`` reads.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .meta import ConditionView, ObjectMeta, conditions_of, int_of

Json = Mapping[str, Any]

# Our own key in a trimmed Workload: the requested level's value on each assigned node, for a
# TopologyAssignment that names the nodes only (queueing.resolve_node_levels).
NODE_LEVELS = "nodeLevels"


@dataclass(frozen=True)
class LevelValues:
    """One level's values in a TopologyAssignmentSlice: one for all its domains, or one each."""

    universal: str | None
    prefix: str
    suffix: str
    roots: tuple[str, ...]

    @classmethod
    def of(cls, level: Json) -> LevelValues:
        each = level.get("individual") or {}
        universal = level.get("universal")
        return cls(
            universal=str(universal) if universal is not None else None,
            prefix=str(each.get("prefix") or ""),
            suffix=str(each.get("suffix") or ""),
            roots=tuple(str(r) for r in each.get("roots") or []),
        )


@dataclass(frozen=True)
class TopologySlice:
    domain_count: int
    values_per_level: tuple[LevelValues, ...]

    @classmethod
    def of(cls, piece: Json) -> TopologySlice:
        return cls(
            domain_count=int_of(piece.get("domainCount")),
            values_per_level=tuple(LevelValues.of(v) for v in piece.get("valuesPerLevel") or []),
        )

    def values(self, index: int) -> list[str]:
        """The level at ``index``'s value of each domain of the slice."""
        level = self.values_per_level[index]
        if level.universal is not None:
            return [level.universal] * self.domain_count
        return [f"{level.prefix}{root}{level.suffix}" for root in level.roots]


@dataclass(frozen=True)
class TopologyAssignment:
    """A PodSetAssignment's topologyAssignment: the levels, and the domains of each slice."""

    levels: tuple[str, ...]
    slices: tuple[TopologySlice, ...]

    @classmethod
    def of(cls, topo: Json) -> TopologyAssignment:
        return cls(
            levels=tuple(str(level) for level in topo.get("levels") or []),
            slices=tuple(TopologySlice.of(piece) for piece in topo.get("slices") or []),
        )

    def values(self, level: str) -> list[str]:
        """Every assigned domain's value at ``level`` (one of ``levels``)."""
        index = list(self.levels).index(level)
        return [v for piece in self.slices for v in piece.values(index)]


@dataclass(frozen=True)
class WorkloadView:
    """A Workload, parsed once from its body (or its trimmed form); a missing field reads as Kueue's default."""

    meta: ObjectMeta
    active: bool = True  # spec.active: Kueue defaults it to true
    conditions: tuple[ConditionView, ...] = ()
    # Per PodSet, the level its topologyRequest asks for (required, else preferred); "" when none.
    requested_levels: tuple[str, ...] = ()
    # Per podSetAssignment, its topologyAssignment; None when it has none.
    assignments: tuple[TopologyAssignment | None, ...] = ()
    node_levels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, workload: Json) -> WorkloadView:
        spec = workload.get("spec") or {}
        status = workload.get("status") or {}
        requests = [ps.get("topologyRequest") or {} for ps in spec.get("podSets") or []]
        assignments = (status.get("admission") or {}).get("podSetAssignments") or []
        return cls(
            meta=ObjectMeta.of(workload),
            active=spec.get("active") is not False,
            conditions=conditions_of(status),
            requested_levels=tuple(str(r.get("required") or r.get("preferred") or "") for r in requests),
            assignments=tuple(
                TopologyAssignment.of(a["topologyAssignment"]) if a.get("topologyAssignment") else None
                for a in assignments
            ),
            node_levels=dict(workload.get(NODE_LEVELS) or {}),
        )

    def topology_requests(self) -> list[tuple[str, TopologyAssignment]]:
        """(requested level, TopologyAssignment) of each PodSet that asked for a level and was assigned."""
        return [
            (wanted, topo)
            for wanted, topo in zip(self.requested_levels, self.assignments, strict=False)
            if wanted and topo is not None
        ]


def trimmed(workload: Json) -> dict[str, Any]:
    """The parts of a Workload the status and the suspend intent need (what ``WorkloadView.of`` reads)."""
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    out: dict[str, Any] = {
        "metadata": {k: copy.deepcopy(meta[k]) for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
        "spec": {k: v for k, v in spec.items() if k in ("active", "queueName")},
        "status": {"conditions": copy.deepcopy(status.get("conditions") or [])},
    }
    requests = [ps.get("topologyRequest") for ps in spec.get("podSets") or []]
    if any(requests):
        out["spec"]["podSets"] = [{"topologyRequest": copy.deepcopy(r or {})} for r in requests]
    assignments = (status.get("admission") or {}).get("podSetAssignments") or []
    if any(a.get("topologyAssignment") for a in assignments):
        out["status"]["admission"] = {
            "podSetAssignments": [
                {"topologyAssignment": copy.deepcopy(a.get("topologyAssignment"))} for a in assignments
            ]
        }
    return out
