"""The kopf handlers, registered on a registry of their own (no import-time globals).

- FSDPTraining create / update / resume → render + server-side apply + status.
- FSDPTraining events → the in-memory view used by job events and the scraper.
- Kueue Workload events (of a queued training's job) → its suspend intent and status;
- job events (PyTorchJobs and TrainJobs owned by an FSDPTraining) → status mirror; a job deleted
  under a live training is re-applied; a job that just finished gets a last
  read of its trainer's metrics.
- start-up: API check, peering object, the pod loop (progress, scheduling); probe: liveness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import kopf
from fsdp_api.contract import GROUP, KUEUE_GROUP, KUEUE_VERSION, PLURAL, VERSION, WORKLOAD_PLURAL

from .. import backends
from .applies import apply_training
from .job_events import TERMINAL_PHASES, handle_job_event
from .kube import KubeClient, default_login
from .metrics import OperatorMetrics
from .peering import ensure_peering_object
from .queueing import owning_job
from .scraper import PeeringView, final_scrape, run_scraper
from .state import Runtime, owner_of
from .workloads import handle_workload_event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    clusterwide: bool
    namespaces: tuple[str, ...]
    peering: PeeringView | None  # None: standalone
    scrape_interval: float  # seconds; 0 disables the progress scraper


def _owned(body: kopf.Body, **_: Any) -> bool:
    return owner_of(body) is not None


def _of_a_job(body: kopf.Body, **_: Any) -> bool:
    return owning_job(body) is not None


def _forget(tasks: list[asyncio.Task[Any]]) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        with contextlib.suppress(ValueError):
            tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("final metrics read failed: %r", task.exception())

    return done


def build_registry(rt: Runtime, options: Options) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    background: list[asyncio.Task[Any]] = []

    @kopf.on.login(id="login", registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # The same credentials as our own client: one identity for every API call.
        return default_login(settings)

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        served = await rt.client.discover(f"{GROUP}/{VERSION}")
        if PLURAL not in served:
            raise kopf.PermanentError(f"{PLURAL}.{GROUP}/{VERSION} is not served: install the CRD (kustomize/crd)")
        refs = [b.ref for b in backends.REGISTRY.values()]
        served_backends = [r.name for r in refs if r.plural in await rt.client.discover(r.api_version)]
        if not served_backends:
            kinds = " nor ".join(f"{r.plural}.{r.api_version}" for r in refs)
            raise kopf.PermanentError(
                f"neither {kinds} is served: install the Kubeflow training operator or Kubeflow Trainer v2 "
                "(docs/backends.md)"
            )
        log.info("backends served by this cluster: %s", ", ".join(served_backends))
        if options.peering is not None:
            if not await rt.client.discover("kopf.dev/v1"):
                raise kopf.PermanentError(
                    "the kopf peering CRDs (kopf.dev) are not installed: apply kustomize/crd or run standalone"
                )
            await ensure_peering_object(rt.client, options.peering.name, options.clusterwide, list(options.namespaces))
        if options.scrape_interval > 0:
            background.append(asyncio.create_task(run_scraper(rt, options.scrape_interval, options.peering)))

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in [*background, *rt.tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await rt.client.close()

    @kopf.on.probe(id="trainings", registry=registry)
    def probe_trainings(**_: Any) -> int:
        return len(rt.trainings)

    @kopf.on.event(GROUP, VERSION, PLURAL, id="view", registry=registry)
    def training_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event["type"] == "DELETED":
            rt.forget(body)
        else:
            rt.remember(body)

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="apply", registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="apply", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="apply", registry=registry)
    async def apply(body: kopf.Body, reason: str, retry: int, **_: Any) -> None:
        phase = (body.get("status") or {}).get("phase")
        if reason == kopf.Reason.RESUME and phase in TERMINAL_PHASES:
            # A finished training's job may be gone (its TTL, a person, a cleanup): applying
            # would create it again and train it again. A spec edited meanwhile is an update.
            meta = body.get("metadata") or {}
            log.info("%s/%s is %s: nothing re-applied on resume", meta.get("namespace"), meta.get("name"), phase)
            return
        # A new training has nothing stale to prune: skip that GET on the hot path.
        await apply_training(rt, body, prune=reason != kopf.Reason.CREATE, retry=retry)

    async def job_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        finished = await handle_job_event(rt, event["type"], body)
        if finished is not None and options.scrape_interval > 0:
            # Off the handler: the read may wait out its timeout on a pod that is gone.
            task = asyncio.create_task(final_scrape(rt, finished))
            background.append(task)
            task.add_done_callback(_forget(background))

    # Every backend's jobs. Without its controller (Trainer v2, the training operator)
    # installed kopf serves nothing for that kind (it logs the resource as unresolved);
    # installed later, it is noticed when the operator restarts (scanning is off, settings.py).
    for backend in backends.REGISTRY.values():
        ref = backend.ref
        watch = kopf.on.event(ref.group, ref.version, ref.plural, id=backend.watch_id, when=_owned, registry=registry)
        watch(job_event)

    # Kueue's Workloads of queued trainings. Without Kueue installed kopf serves
    # nothing here (it logs that the resource is unresolved); installed later,
    # it is noticed when the operator restarts (scanning is off, settings.py).
    @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL, id="workload", when=_of_a_job, registry=registry)
    async def workload_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        await handle_workload_event(rt, event["type"], body)

    return registry


def new_runtime(settings: kopf.OperatorSettings) -> Runtime:
    client = KubeClient(
        lambda: default_login(settings),
        request_timeout=settings.networking.request_timeout or 30.0,
        connect_timeout=settings.networking.connect_timeout or 10.0,
    )
    return Runtime(client=client, metrics=OperatorMetrics())


__all__ = ["Options", "build_registry", "new_runtime"]
