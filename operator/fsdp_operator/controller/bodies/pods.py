"""A pod as the controller reads it: where it runs, its phase, its containers' states, its PodScheduled."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .meta import ConditionView, ObjectMeta, conditions_of, first, int_of

Json = Mapping[str, Any]

POD_SCHEDULED = "PodScheduled"


@dataclass(frozen=True)
class Waiting:
    """A container's state.waiting."""

    reason: str
    message: str

    @classmethod
    def of(cls, waiting: Json) -> Waiting:
        return cls(reason=str(waiting.get("reason") or ""), message=str(waiting.get("message") or ""))


@dataclass(frozen=True)
class Terminated:
    """A container's state.terminated (or lastState.terminated)."""

    exit_code: int | None
    reason: str
    message: str
    finished_at: str  # RFC 3339 as the kubelet wrote it; "" when not set

    @classmethod
    def of(cls, term: Json) -> Terminated:
        code = term.get("exitCode")
        return cls(
            exit_code=code if isinstance(code, int) else None,
            reason=str(term.get("reason") or ""),
            message=str(term.get("message") or ""),
            finished_at=str(term.get("finishedAt") or ""),
        )


@dataclass(frozen=True)
class ContainerState:
    """A container's state or lastState: each part set when its key is there (even empty)."""

    waiting: Waiting | None = None
    running: bool = False
    terminated: Terminated | None = None

    @classmethod
    def of(cls, state: Json | None) -> ContainerState:
        state = state or {}
        return cls(
            waiting=Waiting.of(state["waiting"] or {}) if "waiting" in state else None,
            running="running" in state,
            terminated=Terminated.of(state["terminated"] or {}) if "terminated" in state else None,
        )


@dataclass(frozen=True)
class ContainerStatus:
    """One entry of a pod's status.containerStatuses (or initContainerStatuses)."""

    name: str
    state: ContainerState
    last_state: ContainerState
    restart_count: int

    @classmethod
    def of(cls, cs: Json) -> ContainerStatus:
        return cls(
            name=str(cs.get("name") or ""),
            state=ContainerState.of(cs.get("state")),
            last_state=ContainerState.of(cs.get("lastState")),
            restart_count=int_of(cs.get("restartCount")),
        )

    @property
    def has_started(self) -> bool:
        """Running, or run: its current or last state is past waiting."""
        return self.state.running or self.state.terminated is not None or self.last_state.terminated is not None


@dataclass(frozen=True)
class PodView:
    """A pod, parsed once from its body; a missing field reads as empty."""

    meta: ObjectMeta
    node_name: str = ""
    phase: str = ""
    pod_ip: str = ""
    conditions: tuple[ConditionView, ...] = ()
    init_containers: tuple[ContainerStatus, ...] = ()
    containers: tuple[ContainerStatus, ...] = ()
    body: Json = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, pod: Json) -> PodView:
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        return cls(
            meta=ObjectMeta.of(pod),
            node_name=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or ""),
            pod_ip=str(status.get("podIP") or ""),
            conditions=conditions_of(status),
            init_containers=tuple(ContainerStatus.of(cs) for cs in status.get("initContainerStatuses") or []),
            containers=tuple(ContainerStatus.of(cs) for cs in status.get("containerStatuses") or []),
            body=pod,
        )

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.labels

    @property
    def deleting(self) -> bool:
        return self.meta.deleting

    @property
    def scheduled(self) -> ConditionView | None:
        """The PodScheduled condition, once the scheduler has looked at the pod."""
        return first(self.conditions, POD_SCHEDULED)

    def containers_named(self, names: Collection[str]) -> list[ContainerStatus]:
        """The (app) containers of those names, in the pod's order."""
        return [cs for cs in self.containers if cs.name in names]
