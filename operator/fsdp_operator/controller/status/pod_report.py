"""What a job's pods say: placement (Schedulable), start (PodsStarted), a configuration the trainer rejected.

Pure functions over pod bodies the pod loop (``scraper.py``) lists; the
status turns their answers into conditions (``status/compute.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fsdp_api.contract import CONFIG_ERROR_EXIT_CODE, CONFIG_ERROR_HEADER, TRAINER_CONTAINERS

from ...backends import FAILED_CREATE_POD
from .. import bodies
from .conditions import SCHEDULED, STARTED

Json = Mapping[str, Any]

# Waiting reasons of a container the kubelet cannot start (kubelet
# images/types.go and kuberuntime); ContainerCreating and CrashLoopBackOff are
# not among them: the first passes, the second is the process's own failure.
START_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class Scheduling:
    """What the job's pods say about their placement (the Schedulable condition)."""

    scheduled: bool
    reason: str
    message: str


def pod_scheduling(pods: Iterable[Json], expected: int) -> Scheduling | None:
    """Scheduling state of a job from its pods; None while it is not known yet.

    The scheduler records every failed attempt on the pod as PodScheduled=False
    (reason Unschedulable, message "0/N nodes are available: ..."), so any such
    pod explains why the job cannot start. "Scheduled" needs all ``expected``
    pods to exist and be bound; pods not yet seen by the scheduler (no
    condition) or not yet created leave the answer open.
    """
    live = bodies.pod_views(pods)
    stuck = []
    bound = 0
    for pod in live:
        cond = pod.scheduled
        if cond is not None and cond.status == "False":
            stuck.append((pod.name, cond))
        elif (cond is not None and cond.status == "True") or pod.node_name:
            bound += 1
    if stuck:
        stuck.sort(key=lambda item: item[0])
        name, cond = stuck[0]
        reason = cond.reason or "Unschedulable"
        detail = cond.message or reason
        count = f"{len(stuck)} of {len(live)} pods" if len(live) > 1 else "the pod"
        return Scheduling(False, reason, f"{count} cannot be scheduled: {name}: {detail}")
    if live and bound == len(live) and bound >= expected:
        return Scheduling(True, SCHEDULED, f"all {bound} pods are scheduled")
    return None


def _check_lines(message: str) -> str:
    """The check's error lines from a termination message (a log tail), as one line.

    The tail may start with earlier output (library warnings): only the lines
    after the last CONFIG_ERROR_HEADER are the check's. Without the header,
    the last non-empty line is the best guess.
    """
    lines = message.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].rstrip().endswith(CONFIG_ERROR_HEADER):
            found = [line.strip() for line in lines[i + 1 :] if line.startswith("  ") and line.strip()]
            if found:
                return "; ".join(found)
    rest = [line.strip() for line in lines if line.strip()]
    return rest[-1] if rest else ""


def config_rejection(pods: Iterable[Json]) -> str | None:
    """Why the trainer rejected its configuration, from the first pod whose trainer container says so; else None.

    Read from the current or the last termination of the trainer container
    (OnFailure restarts it in place, so the failure is usually lastState).
    """
    for pod in sorted(bodies.pod_views(pods), key=lambda p: p.name):
        for cs in pod.containers_named(TRAINER_CONTAINERS):
            for state in (cs.state, cs.last_state):
                term = state.terminated
                if term is not None and term.exit_code == CONFIG_ERROR_EXIT_CODE:
                    detail = _check_lines(term.message) or (
                        f"exit code {CONFIG_ERROR_EXIT_CODE}; the pod's log says why"
                    )
                    return f"the trainer rejected its configuration in pod {pod.name}: {detail}"
    return None


@dataclass(frozen=True)
class Start:
    """Whether the job's pods exist and their containers started (the PodsStarted condition)."""

    started: bool
    reason: str
    message: str


def pod_start(pods: Iterable[Json], expected: int, create_failure: str | None = None) -> Start | None:
    """Start state of a job from its pods (and the training operator's last pod-creation error); None while open.

    A container waiting for a reason in START_FAILURES explains the job, as
    does ``create_failure`` while pods are missing. "Started" needs all
    ``expected`` pods with their trainer container running or run.
    """
    live = sorted(bodies.pod_views(pods), key=lambda p: p.name)
    stuck = []
    for pod in live:
        for cs in [*pod.init_containers, *pod.containers]:
            waiting = cs.state.waiting
            if waiting is not None and waiting.reason in START_FAILURES:
                stuck.append((pod.name, cs.name, waiting))
    if stuck:
        name, container, waiting = stuck[0]
        count = f"{len({s[0] for s in stuck})} of {len(live)} pods" if len(live) > 1 else "the pod"
        detail = waiting.message or waiting.reason
        return Start(False, waiting.reason, f"{count} cannot start: {name}: container {container}: {detail}")
    if create_failure and len(live) < expected:
        return Start(False, FAILED_CREATE_POD, f"the training operator cannot create the pods: {create_failure}")

    def started(pod: bodies.PodView) -> bool:
        return next((cs.has_started for cs in pod.containers_named(TRAINER_CONTAINERS)), False)

    if live and len(live) >= expected and all(started(p) for p in live):
        return Start(True, STARTED, f"the trainer containers of all {len(live)} pods have started")
    return None


@dataclass(frozen=True)
class PodsReport:
    """What one look at a job's pods says: placement, start, and a configuration the trainer rejected."""

    scheduling: Scheduling | None
    rejection: str | None = None
    start: Start | None = None


def pods_report(pods: Iterable[Json], expected: int, create_failure: str | None = None) -> PodsReport:
    pods = list(pods)
    return PodsReport(pod_scheduling(pods, expected), config_rejection(pods), pod_start(pods, expected, create_failure))
