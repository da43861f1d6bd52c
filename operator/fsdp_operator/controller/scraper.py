"""The background loop that copies running jobs' step/loss/throughput into their status.

One loop for all trainings (not a kopf timer per object: kopf timers require
a finalizer on every object, which would make deleting a training depend on
the operator being up). Per tick: one pod LIST per namespace with running
trainings, one metrics GET per running training, a status patch only when a
number moved.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..api.spec import MetricsSpec
from .kube import NETWORK_ERRORS, ApiError
from .peering import we_are_active
from .progress import JOB_NAME_LABEL, REPLICA_INDEX_LABEL, rank0_pod, scrape
from .reconcile import Runtime, record_progress

log = logging.getLogger(__name__)

# Scrapes in flight at once: bounded so a thousand running jobs cannot open a thousand sockets.
MAX_CONCURRENT_SCRAPES = 16


@dataclass(frozen=True)
class PeeringView:
    name: str
    clusterwide: bool
    identity: str
    priority: int


def running_trainings(rt: Runtime) -> list[Mapping[str, Any]]:
    out = []
    for body in list(rt.trainings.values()):
        phase = rt.previous_status(body).get("phase")
        metrics = (body.get("spec") or {}).get("metrics") or {}
        if phase == "Running" and metrics.get("enabled", True):
            out.append(body)
    return out


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
    by_namespace: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for body in running_trainings(rt):
        by_namespace[body["metadata"]["namespace"]].append(body)
    if not by_namespace:
        return 0
    gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
    updated = 0

    async def one(body: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> None:
        nonlocal updated
        job_name = rt.previous_status(body).get("jobName")
        pod = rank0_pod(p for p in pods if p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) == job_name)
        if pod is None:
            return
        port = int(
            ((body.get("spec") or {}).get("metrics") or {}).get("port", MetricsSpec.model_fields["port"].default)
        )
        async with gate:
            progress = await scrape(session, pod["status"]["podIP"], port)
        if progress is None:
            rt.metrics.scrapes.labels("error").inc()
            return
        rt.metrics.scrapes.labels("success").inc()
        fields = progress.status_fields()
        if fields and await record_progress(rt, body, fields):
            updated += 1

    for namespace, bodies in by_namespace.items():
        if not await _allowed(rt, peering, namespace):
            continue
        try:
            # Only index-0 pods can host node rank 0: a small list even for big jobs.
            pods = await rt.client.list("v1", "Pod", namespace, f"{JOB_NAME_LABEL},{REPLICA_INDEX_LABEL}=0")
        except (ApiError, *NETWORK_ERRORS) as e:
            log.debug("listing pods in %s failed: %s", namespace, e)
            continue
        results = await asyncio.gather(*(one(b, pods) for b in bodies), return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.debug("progress update failed: %r", r)
    return updated


async def run_scraper(rt: Runtime, interval: float, peering: PeeringView | None) -> None:
    """Forever: scrape, sleep. Errors never end the loop; the next tick retries."""
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                await scrape_once(rt, session, peering)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("progress scrape pass failed")
            await asyncio.sleep(interval)
