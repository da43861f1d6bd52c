"""The background loop that watches over jobs' pods: progress while they run, placement while they wait.

One loop for all trainings (not a kopf timer per object: kopf timers require
a finalizer on every object, which would make deleting a training depend on
the operator being up). Per tick:

- running trainings: one pod LIST per namespace, one metrics GET per
  training, a status patch only when a number moved;
- trainings whose pods are not all running yet, or that have not reported
  a step yet: one pod LIST per training, so that a job the scheduler cannot
  place says why (the Schedulable condition) and a configuration the
  trainer's check rejects is shown (the ConfigValid condition), a status
  patch only when one of those changed;
- every ``NODE_CHECK_TICKS`` ticks, trainings with pods: one pod LIST per
  namespace and backend, one node LIST, and for running trainings one
  metrics GET per pod, so that a node whose own conditions report a problem,
  whose rank keeps its peers waiting, or where the training failed or stalled
  again and again, is named (the NodesHealthy condition, node_health.py,
  stragglers.py and incidents.py).

When a job finishes, ``final_scrape`` reads its trainer's metrics once more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from fsdp_api.contract import EXCLUDED_NODE_LABEL, JobBackend

from .. import backends
from .bodies import EventView, MetricsView, PodView, conditions_of, live_pods, name_of, uid_of
from .kube import NETWORK_ERRORS, ApiError
from .node_exclusion import TaintLedger, exclude_suspects, lift_expired
from .nodes.health import node_health
from .nodes.incidents import new_failures, repeated, with_failures, without
from .nodes.stragglers import RankCounters, RankKey, StragglerWatch, rank_counters
from .nodes.xids import new_xids
from .peering import we_are_active
from .progress import TrainerProgress, Unreadable, node_rank_0_progress, rank0_pod, read_pods, scrape
from .records import record_nodes, record_pods, record_progress
from .stall_check import check_stall
from .state import Runtime
from .status.completion import completion_fields
from .status.compute import FAILED_CREATE_POD, SCHEDULABLE, TrainingFacts, pods_report, rfc3339

log = logging.getLogger(__name__)

# Scrapes in flight at once: bounded so a thousand running jobs cannot open a thousand sockets.
MAX_CONCURRENT_SCRAPES = 16
# The node check runs every this many ticks (every 3 minutes at the default 30 s): node
# conditions change slowly, and a node LIST of a large cluster is not free.
NODE_CHECK_TICKS = 6
# spec.tracking's trackers whose runs have a page the status links (trackerRuns).
TRACKERS_WITH_PAGES = ("mlflow", "wandb")
# Phases whose pods are on nodes (or about to be).
WITH_PODS = ("Running", "Restarting")


@dataclass(frozen=True)
class PeeringView:
    name: str
    clusterwide: bool
    identity: str
    priority: int


def running_trainings(rt: Runtime) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for body in list(rt.trainings.values()):
        phase = rt.previous_status(body).get("phase")
        if phase == "Running" and MetricsView.of(body).enabled:
            out.append(body)
    return out


def _fewer_pods_than_nodes(job: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Only a backend whose replicaStatuses count pods can tell; for others the rest of waiting_trainings covers it."""
    if not backends.of_kind(job.get("kind")).counts_pods:
        return False
    return backends.job_view(job).active() < TrainingFacts.from_body(body).nodes


def waiting_trainings(rt: Runtime) -> list[Mapping[str, Any]]:
    """Trainings with a job whose pods may be waiting for a node or failing their config check.

    Created or Restarting jobs; and Running ones with fewer active pods than
    nodes (Kubeflow calls a worker-only job Running as soon as one worker
    runs), still marked unschedulable, or without a first step in the status
    (a container that fails the check restarts in place, so its pod stays
    active). A job whose pods all run and train costs nothing.
    """
    out: list[Mapping[str, Any]] = []
    for body in list(rt.trainings.values()):
        job = rt.jobs.get(uid_of(body))
        if job is None:
            continue
        status = rt.previous_status(body)
        phase = status.get("phase")
        if phase in ("Created", "Restarting"):
            out.append(body)
        elif phase == "Running":
            stuck = any(c.type == SCHEDULABLE and c.status == "False" for c in conditions_of(status))
            starting = status.get("step") is None
            if stuck or starting or _fewer_pods_than_nodes(job, body):
                out.append(body)
    return out


async def check_pods_once(rt: Runtime, peering: PeeringView | None) -> int:
    """One pass over the waiting trainings; returns how many Schedulable/ConfigValid conditions changed."""
    by_namespace: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for body in waiting_trainings(rt):
        by_namespace[body["metadata"]["namespace"]].append(body)
    gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
    changed = 0

    async def one(body: Mapping[str, Any]) -> None:
        nonlocal changed
        job_name = rt.previous_status(body).get("jobName") or body["metadata"]["name"]
        namespace, expected = body["metadata"]["namespace"], TrainingFacts.from_body(body).nodes
        backend = backends.of_training(body)
        async with gate:
            pods = await rt.client.list("v1", "Pod", namespace, f"{backend.ref.job_label}={job_name}")
            live = live_pods(pods)
            job = rt.jobs.get(uid_of(body)) or {}
            create_failure = None
            if len(live) < expected and (job_uid := uid_of(job)):
                selector = backend.pod_creation_failures(job_name, job_uid)
                create_failure = await last_create_failure(rt, namespace, selector)
        report = pods_report(pods, expected, create_failure)
        known = (report.scheduling, report.rejection, report.start)
        if any(k is not None for k in known) and await record_pods(rt, body, report):
            changed += 1

    for namespace, bodies in by_namespace.items():
        if not await _allowed(rt, peering, namespace):
            continue
        results = await asyncio.gather(*(one(b) for b in bodies), return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.debug("pods check failed: %r", r)
    return changed


async def last_create_failure(rt: Runtime, namespace: str, selector: str) -> str | None:
    """The message of the newest Event matching ``selector`` (the backend's ``pod_creation_failures``), if any.

    That is why pods are missing: quota, an admission webhook, Pod Security.
    """
    events = [EventView.of(e) for e in await rt.client.list("v1", "Event", namespace, field_selector=selector)]
    newest = max(events, key=lambda e: e.last_seen, default=None)
    return (newest.message or FAILED_CREATE_POD) if newest is not None else None


async def final_scrape(rt: Runtime, training: Mapping[str, Any]) -> bool:
    """Read a finished job's metrics one last time, if its rank-0 pod still answers.

    Best effort: the trainer usually exits before Kubeflow marks the job
    finished, so this mostly finds nothing. A Succeeded job's step does not
    depend on it (see status.compute_status).
    """
    metrics = MetricsView.of(training)
    if not metrics.enabled:
        return False
    meta = training["metadata"]
    job_name = rt.previous_status(training).get("jobName") or meta["name"]
    ref = backends.of_training(training).ref
    try:
        selector = f"{ref.job_label}={job_name},{ref.index_label}=0"
        pods = await rt.client.list("v1", "Pod", meta["namespace"], selector)
    except (ApiError, *NETWORK_ERRORS) as e:
        log.debug("listing pods of %s/%s failed: %s", meta["namespace"], job_name, e)
        return False
    pod = rank0_pod(pods, running_only=False)
    if pod is None:
        return False
    async with aiohttp.ClientSession() as session:
        progress = await scrape(session, PodView.of(pod).pod_ip, metrics.port)
    rt.metrics.scrapes.labels("error" if isinstance(progress, Unreadable) else "success").inc()
    if isinstance(progress, Unreadable) or not progress.status_fields():
        return False
    return await record_progress(rt, training, progress.status_fields(), final=True)


async def _allowed(rt: Runtime, peering: PeeringView | None, namespace: str) -> bool:
    if peering is None:
        return True
    try:
        return await we_are_active(
            rt.client, peering.name, peering.clusterwide, namespace, peering.identity, peering.priority
        )
    except (ApiError, *NETWORK_ERRORS):
        return False  # unsure whether we are the active peer: write nothing


async def scrape_once(rt: Runtime, session: aiohttp.ClientSession, peering: PeeringView | None) -> int:
    """One pass over the running trainings; returns how many statuses were updated."""
    by_namespace: dict[tuple[str, JobBackend], list[Mapping[str, Any]]] = defaultdict(list)
    running = running_trainings(rt)
    for body in running:
        by_namespace[body["metadata"]["namespace"], backends.of_training(body).ref].append(body)
    # A training that stops running (suspended, restarting, finished) starts its stall clock afresh.
    keep = {uid_of(b) for b in running}
    for uid in [u for u in rt.step_clocks if u not in keep]:
        del rt.step_clocks[uid]
    if not by_namespace:
        return 0
    gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
    updated = 0

    async def one(body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], backend: JobBackend) -> None:
        nonlocal updated
        job_name = rt.previous_status(body).get("jobName")
        pod = rank0_pod(p for p in pods if PodView.of(p).labels.get(backend.job_label) == job_name)
        if pod is None:
            await check_stall(rt, body, None, time.monotonic())
            return
        async with gate:
            progress = await scrape(session, PodView.of(pod).pod_ip, MetricsView.of(body).port)
        rt.metrics.scrapes.labels("error" if isinstance(progress, Unreadable) else "success").inc()
        fields = (
            {} if isinstance(progress, Unreadable) else {**progress.status_fields(), **_completion(rt, body, progress)}
        )
        if job_name and not isinstance(progress, Unreadable) and _tracker_runs_elsewhere(rt, body, progress):
            async with gate:
                runs = await _node_rank_0_runs(rt, session, body, backend, job_name)
            if runs:
                fields["trackerRuns"] = runs
        if fields and await record_progress(rt, body, fields):
            updated += 1
        await check_stall(rt, body, progress, time.monotonic(), session)

    for (namespace, backend), bodies in by_namespace.items():
        if not await _allowed(rt, peering, namespace):
            continue
        try:
            # Index-0 pods only: a small list even for big jobs. Every rank serves the step and the
            # loss, so whichever node rank torchrun gave that pod, its figures are the job's (the
            # tracker runs, rank 0's alone, are looked for on the other pods: _tracker_runs_elsewhere).
            selector = f"{backend.job_label},{backend.index_label}=0"
            pods = await rt.client.list("v1", "Pod", namespace, selector)
        except (ApiError, *NETWORK_ERRORS) as e:
            log.debug("listing pods in %s failed: %s", namespace, e)
            continue
        results = await asyncio.gather(*(one(b, pods, backend) for b in bodies), return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.debug("progress update failed: %r", r)
    return updated


def _tracker_runs_elsewhere(rt: Runtime, body: Mapping[str, Any], progress: TrainerProgress) -> bool:
    """Whether the tracker runs' pages are still to be read from another pod than the index-0 one.

    Global rank 0 alone exports them, and it lives on node rank 0, which
    torchrun may give any pod. Asked only until the status has them, for a
    training that logs to a tracker with run pages.
    """
    tracking = (body.get("spec") or {}).get("tracking") or {}
    return (
        progress.node_rank not in (None, 0)
        and not progress.tracker_runs
        and "trackerRuns" not in rt.previous_status(body)
        and any(tracking.get(name) for name in TRACKERS_WITH_PAGES)
    )


async def _node_rank_0_runs(
    rt: Runtime, session: aiohttp.ClientSession, body: Mapping[str, Any], backend: JobBackend, job_name: str
) -> dict[str, str] | None:
    try:
        pods = await rt.client.list("v1", "Pod", body["metadata"]["namespace"], f"{backend.job_label}={job_name}")
    except (ApiError, *NETWORK_ERRORS) as e:
        log.debug("listing the pods of %s failed: %s", job_name, e)
        return None
    progress = await node_rank_0_progress(session, pods, MetricsView.of(body).port)
    return dict(progress.tracker_runs) if progress is not None and progress.tracker_runs else None


def _completion(rt: Runtime, body: Mapping[str, Any], progress: TrainerProgress) -> dict[str, Any]:
    """Progress and time left; the step time is the stall clock's recent one, else the trainer's mean."""
    clock = rt.step_clocks.get(uid_of(body))
    rate = (clock.seconds_per_step or clock.reported) if clock is not None else None
    # The running trainer's own maxSteps: an edit of the spec's reaches the pods only when the job is
    # re-rendered, and until then a lowered value would show 100% of a training that goes on.
    max_steps = progress.max_steps or TrainingFacts.from_body(body).max_steps
    return completion_fields(progress.step, max_steps, rate or progress.seconds_per_step)


async def check_nodes_once(rt: Runtime, session: aiohttp.ClientSession, peering: PeeringView | None) -> int:
    """One look at the nodes under every training with pods; returns how many NodesHealthy conditions changed.

    The node conditions need ``list`` on nodes (cluster-scoped): an install
    that may not read them (namespaced mode, docs/operator.md) goes without
    them, and still reads the ranks' lateness from the pods of running trainings.
    """
    trainings = [b for b in list(rt.trainings.values()) if rt.previous_status(b).get("phase") in WITH_PODS]
    watched = {uid_of(b) for b in trainings if _reads_lateness(rt, b)}
    for uid in [u for u in rt.stragglers if u not in watched]:
        del rt.stragglers[uid]  # a straggler is judged within one run of the pods
    # Without trainings only the excluded nodes matter (their taints may be due): a labelled, small list.
    nodes = await _nodes(rt, None if trainings else EXCLUDED_NODE_LABEL)
    now = datetime.now(UTC)
    lifted = await lift_expired(rt, nodes, now) if nodes is not None else []
    if not trainings:
        return 0
    # One count of the cluster's excluded nodes for the whole check, so the cap holds across trainings.
    ledger = TaintLedger.of(nodes or {}, lifted)
    xids = await new_xids(session)
    groups: dict[tuple[str, JobBackend], list[Mapping[str, Any]]] = defaultdict(list)
    for body in trainings:
        groups[body["metadata"]["namespace"], backends.of_training(body).ref].append(body)
    gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
    changed = 0

    async def one(body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], backend: JobBackend) -> None:
        nonlocal changed
        job_name = rt.previous_status(body).get("jobName") or body["metadata"]["name"]
        mine = [p for p in pods if PodView.of(p).labels.get(backend.job_label) == job_name]
        late = await _stragglers(rt, session, gate, body, mine) if uid_of(body) in watched else None
        before = list(rt.previous_status(body).get("nodeIncidents") or [])
        own, shared = new_failures(mine, before)
        incidents = with_failures(before, own, shared, rfc3339(now))
        health = node_health(mine, nodes, late, xids, repeated(incidents))
        if health is None:
            return
        done = await exclude_suspects(rt, body, health, nodes, now, ledger)
        if done.excluded is not None:
            rt.stragglers.pop(uid_of(body), None)  # the restarted ranks are judged afresh
            incidents = without(incidents, (e["node"] for e in done.excluded))
        kept = incidents if incidents != before else None
        if await record_nodes(rt, body, done.health, excluded=done.excluded, incidents=kept, events=list(done.events)):
            changed += 1

    for (namespace, backend), bodies in groups.items():
        if not await _allowed(rt, peering, namespace):
            continue
        pods = live_pods(await rt.client.list("v1", "Pod", namespace, backend.job_label))
        results = await asyncio.gather(*(one(b, pods, backend) for b in bodies), return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.debug("node check failed: %r", r)
    return changed


async def _nodes(rt: Runtime, selector: str | None = None) -> dict[str, Mapping[str, Any]] | None:
    """The nodes by name; None when this install may not list them."""
    try:
        return {name_of(n): n for n in await rt.client.list("v1", "Node", None, selector)}
    except ApiError as e:
        if e.status in (401, 403):
            log.debug("node conditions are not read: this install may not list nodes (%s)", e)
            return None
        raise


def _reads_lateness(rt: Runtime, body: Mapping[str, Any]) -> bool:
    return rt.previous_status(body).get("phase") == "Running" and MetricsView.of(body).enabled


async def _stragglers(
    rt: Runtime,
    session: aiohttp.ClientSession,
    gate: asyncio.Semaphore,
    body: Mapping[str, Any],
    pods: list[Mapping[str, Any]],
) -> dict[str, list[str]] | None:
    """Every running pod's rank counters read once more: the straggling ranks by node (stragglers.py).

    None until a window closed: a training whose pods never answered, or
    answered once, has not been judged, and its message must not say it was.
    """
    found = await read_pods(session, pods, MetricsView.of(body).port, rank_counters, gate)
    reads: dict[RankKey, RankCounters] = {}
    for counters in found.values():
        rt.metrics.scrapes.labels("error" if counters is None else "success").inc()
        reads.update(counters or {})
    watch = rt.stragglers.setdefault(uid_of(body), StragglerWatch())
    watch.update(reads)
    return watch.evidence() if watch.judged else None


async def run_scraper(rt: Runtime, interval: float, peering: PeeringView | None) -> None:
    """Forever: scrape, check placement (and, every few ticks, the nodes), sleep. Errors never end the loop."""
    tick = 0
    async with aiohttp.ClientSession() as session:
        while True:
            passes = [
                ("progress scrape", lambda: scrape_once(rt, session, peering)),
                ("pods check", lambda: check_pods_once(rt, peering)),
            ]
            if tick % NODE_CHECK_TICKS == 0:
                passes.append(("node check", lambda: check_nodes_once(rt, session, peering)))
            tick += 1
            for name, one_pass in passes:
                try:
                    await one_pass()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s pass failed", name)
            await asyncio.sleep(interval)
