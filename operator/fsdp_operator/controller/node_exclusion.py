"""Excluding a suspect node (spec.health.onSuspectNode exclude): taint it for trainings, restart the pods elsewhere.

The node check (scraper.py) finds the suspects (node_health.py, stragglers.py).
For a training that asked for it, each suspect within the caps gets the
``training.fsdp.dev/excluded:NoSchedule`` taint, with the time it is lifted
and the reason in annotations, and the training's pods are deleted: their
controller re-creates them, the scheduler keeps them off the tainted node
(Karpenter provisions a replacement when nothing else fits) and the trainers
resume from the last checkpoint. NoSchedule evicts nothing: other pods on the
node stay. Two caps keep a systemic fault from draining the cluster: per
training (``spec.health.maxExcludedNodes``, over its life) and per cluster
(``FSDP_OPERATOR_MAX_EXCLUDED_NODES`` nodes tainted at once). Every node check
lifts the taints whose time is up (docs/operator.md, "Excluding a node").
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from fsdp_api.contract import (
    EXCLUDED_BY_ANNOTATION,
    EXCLUDED_NODE_LABEL,
    EXCLUDED_NODE_TAINT,
    EXCLUDED_UNTIL_ANNOTATION,
)
from fsdp_api.spec import HealthSpec
from pydantic import ValidationError

from .bodies import NodeView, uid_of
from .kube import ApiError
from .nodes.health import NodeHealth, SuspectNode
from .settings import env_int
from .stall_check import restart_pods
from .state import Runtime
from .status.compute import EventSpec, rfc3339

log = logging.getLogger(__name__)

CLUSTER_CAP_ENV = "FSDP_OPERATOR_MAX_EXCLUDED_NODES"
DEFAULT_CLUSTER_CAP = 3
# A training's own evidence (its ranks' lateness, read from its own /metrics; its containers'
# failures) is the training's word: a namespace user can fake either and point it at any node
# with affinity. By default it only alerts; the admin opts in to excluding on it.
WORKLOAD_EVIDENCE_ENV = "FSDP_OPERATOR_EXCLUDE_ON_WORKLOAD_EVIDENCE"
# The longest a taint stays, whatever a training asks in health.excludeSeconds (up to 7 days).
MAX_EXCLUDE_SECONDS_ENV = "FSDP_OPERATOR_MAX_EXCLUDE_SECONDS"
DEFAULT_MAX_EXCLUDE_SECONDS = 86_400
NODE_EXCLUDED = "NodeExcluded"
# A node annotation holds at most this much of the reason.
MAX_REASON = 1024

Json = Mapping[str, Any]


def health_spec(spec: Mapping[str, Any]) -> HealthSpec:
    """The training's health settings, read leniently (a spec the API server stored is valid)."""
    try:
        return HealthSpec.model_validate(spec.get("health") or {})
    except ValidationError:
        return HealthSpec()


def cluster_cap() -> int:
    return env_int(CLUSTER_CAP_ENV, DEFAULT_CLUSTER_CAP)


def excludes_on_workload_evidence() -> bool:
    return os.environ.get(WORKLOAD_EVIDENCE_ENV, "").strip().lower() in ("1", "true", "yes")


def exclude_seconds(asked: int) -> int:
    """What a training asked (health.excludeSeconds), at most the operator's cap."""
    return min(asked, env_int(MAX_EXCLUDE_SECONDS_ENV, DEFAULT_MAX_EXCLUDE_SECONDS, minimum=60))


def node_side_only(suspects: tuple[SuspectNode, ...]) -> tuple[tuple[SuspectNode, ...], str | None]:
    """The suspects this install may exclude, and why the others stay (only the training's own evidence)."""
    if excludes_on_workload_evidence():
        return suspects, None
    kept = tuple(s for s in suspects if s.node_side)
    held = [s.node for s in suspects if not s.node_side]
    if not held:
        return kept, None
    return kept, (
        f"not excluded: {', '.join(held)} only on the training's own evidence (its ranks' lateness or its "
        f"containers' failures); the operator excludes on it with {WORKLOAD_EVIDENCE_ENV}=true (docs/operator.md)"
    )


def is_excluded(node: Json) -> bool:
    return NodeView.of(node).has_taint(EXCLUDED_NODE_TAINT)


@dataclass
class TaintLedger:
    """The cluster's excluded nodes through one node check, across every training it looks at.

    The check lists the nodes once and then judges the trainings concurrently:
    each plan must count the taints the plans before it added in the same
    check, or N trainings on N suspect nodes taint all N under a cap of 1.
    The lock makes plan-and-taint one step per training.
    """

    tainted: set[str]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def of(cls, nodes: Mapping[str, Json], lifted: Iterable[str] = ()) -> TaintLedger:
        """From the check's node list, less the taints it has just lifted."""
        return cls({name for name, node in nodes.items() if is_excluded(node)} - set(lifted))


@dataclass(frozen=True)
class ExclusionPlan:
    exclude: tuple[SuspectNode, ...]
    note: str | None  # why a suspect stays: a cap


def plan(suspects: tuple[SuspectNode, ...], allowed: int, already: int, tainted: set[str], cap: int) -> ExclusionPlan:
    """Which suspects to exclude now: ``allowed`` per training of which ``already`` used, ``cap`` tainted at once.

    A node some training already excluded costs no more of the cluster's cap
    (its taint is there), only of this training's.
    """
    out: list[SuspectNode] = []
    note = None
    left, free = allowed - already, cap - len(tainted)
    for suspect in suspects:
        if left <= 0:
            note = f"not excluded: this training has excluded {already} node(s), its limit (health.maxExcludedNodes)"
            break
        if suspect.node not in tainted:
            if free <= 0:
                note = (
                    f"not excluded: {len(tainted)} node(s) of the cluster are excluded already, "
                    f"the operator's limit ({CLUSTER_CAP_ENV})"
                )
                continue
            free -= 1
        out.append(suspect)
        left -= 1
    return ExclusionPlan(tuple(out), note)


def taint_patch(node: Json, until: str, by: str) -> dict[str, Any]:
    """A merge patch adding our taint (the whole list: a merge patch replaces lists), guarded by resourceVersion."""
    view = NodeView.of(node)
    return {
        "metadata": {
            "resourceVersion": view.meta.resource_version,
            "labels": {EXCLUDED_NODE_LABEL: "true"},
            "annotations": {EXCLUDED_UNTIL_ANNOTATION: until, EXCLUDED_BY_ANNOTATION: by[:MAX_REASON]},
        },
        "spec": {
            "taints": [
                *view.taints_without(EXCLUDED_NODE_TAINT),
                {"key": EXCLUDED_NODE_TAINT, "value": "suspect", "effect": "NoSchedule"},
            ]
        },
    }


def lift_patch(node: Json) -> dict[str, Any]:
    view = NodeView.of(node)
    return {
        "metadata": {
            "resourceVersion": view.meta.resource_version,
            "labels": {EXCLUDED_NODE_LABEL: None},
            "annotations": {EXCLUDED_UNTIL_ANNOTATION: None, EXCLUDED_BY_ANNOTATION: None},
        },
        "spec": {"taints": view.taints_without(EXCLUDED_NODE_TAINT)},
    }


def due(node: Json, now: datetime) -> bool:
    """Whether our taint on the node is to be lifted: its time is up, or the time we wrote is unreadable.

    A taint without either of our annotations is not ours: an admin who keeps a node out by hand
    with the same key (``kubectl taint node n training.fsdp.dev/excluded=...``) keeps it out.
    """
    view = NodeView.of(node)
    if not view.has_taint(EXCLUDED_NODE_TAINT):
        return False
    notes = view.annotations
    if EXCLUDED_UNTIL_ANNOTATION not in notes and EXCLUDED_BY_ANNOTATION not in notes:
        return False
    until = notes.get(EXCLUDED_UNTIL_ANNOTATION)
    try:
        return datetime.fromisoformat(str(until).replace("Z", "+00:00")) <= now
    except ValueError:
        return True


async def lift_expired(rt: Runtime, nodes: Mapping[str, Json], now: datetime) -> list[str]:
    """Lift our taint where its time is up; returns the nodes."""
    lifted = []
    for name, node in nodes.items():
        if not due(node, now):
            continue
        try:
            await rt.client.merge_patch("v1", "Node", None, name, lift_patch(node))
        except ApiError as e:
            log.warning("could not lift the exclusion of node %s: %s", name, e)
            continue
        log.info("lifted the exclusion of node %s", name)
        lifted.append(name)
    return lifted


@dataclass(frozen=True)
class Exclusion:
    """What one node check did for one training: the health to record, its excluded nodes, the Events."""

    health: NodeHealth
    excluded: list[dict[str, Any]] | None = None  # status.excludedNodes, when it grew
    events: tuple[EventSpec, ...] = ()


async def exclude_suspects(
    rt: Runtime,
    training: Mapping[str, Any],
    health: NodeHealth,
    nodes: Mapping[str, Json] | None,
    now: datetime,
    ledger: TaintLedger | None = None,
) -> Exclusion:
    """For onSuspectNode exclude: taint the suspects within the caps and restart the pods elsewhere.

    ``ledger``: the check's tainted nodes, shared by every training it judges (one list of the nodes).
    """
    spec = health_spec(training.get("spec") or {})
    if spec.on_suspect_node != "exclude" or health.healthy:
        return Exclusion(health)
    if nodes is None:
        return Exclusion(replace(health, note="not excluded: this install may not read nodes (docs/operator.md, RBAC)"))
    uid = uid_of(training)
    if rt.jobs.get(uid) is None or uid in rt.applying:
        return Exclusion(health)  # the status could not record it now (records.py): the next check acts
    previous = rt.previous_status(training)
    already = list(previous.get("excludedNodes") or [])
    ledger = ledger or TaintLedger.of(nodes)
    until = rfc3339(now + timedelta(seconds=exclude_seconds(spec.exclude_seconds)))
    eligible, held = node_side_only(health.suspects)
    async with ledger.lock:
        chosen = plan(eligible, spec.max_excluded_nodes, len(already), ledger.tainted, cluster_cap())
        note, done = await _taint(rt, training, chosen, nodes, ledger, rfc3339(now), until)
    note = "; ".join(n for n in (note, held) if n) or None
    if not done:
        return Exclusion(replace(health, note=note))
    meta = training["metadata"]
    rt.metrics.node_exclusions.labels(meta["namespace"], meta["name"]).inc(len(done))
    deleted = await restart_pods(rt, training)
    last = (previous.get("checkpoint") or {}).get("lastStep")
    source = f"checkpoint step {last}" if last is not None else "their newest checkpoint"
    total = len(already) + len(done)
    events = tuple(
        EventSpec(
            "Warning",
            NODE_EXCLUDED,
            f"excluded node {d['node']} ({d['reason']}): tainted {EXCLUDED_NODE_TAINT}:NoSchedule until {d['until']}; "
            f"deleted {deleted} pods to resume from {source} on other nodes "
            f"(excluded {total} of at most {spec.max_excluded_nodes})",
        )
        for d in done
    )
    for e in events:
        log.warning("%s: %s", meta.get("name"), e.message)
    named = ", ".join(d["node"] for d in done)
    return Exclusion(
        replace(health, note=f"excluded {named} and restarted the pods elsewhere" + (f"; {note}" if note else "")),
        excluded=[*already, *done][-64:],
        events=events,
    )


async def _taint(
    rt: Runtime,
    training: Mapping[str, Any],
    chosen: ExclusionPlan,
    nodes: Mapping[str, Json],
    ledger: TaintLedger,
    now: str,
    until: str,
) -> tuple[str | None, list[dict[str, Any]]]:
    """Taint the chosen suspects not tainted yet, each counted in ``ledger``; why any stays, and what was done."""
    meta = training["metadata"]
    note, done = chosen.note, []
    for suspect in chosen.exclude:
        reason = "; ".join(suspect.evidence)
        if suspect.node not in ledger.tainted:
            by = f"{meta['namespace']}/{meta['name']}: {reason}"
            try:
                await rt.client.merge_patch(
                    "v1", "Node", None, suspect.node, taint_patch(nodes[suspect.node], until, by)
                )
            except ApiError as e:
                if e.status in (401, 403):
                    note = (
                        "not excluded: this install may not taint nodes (components/node-exclusion, docs/operator.md)"
                    )
                    break
                log.warning("could not exclude node %s: %s", suspect.node, e)
                continue
            ledger.tainted.add(suspect.node)
        done.append({"node": suspect.node, "reason": reason[:MAX_REASON], "time": now, "until": until})
    return note, done
