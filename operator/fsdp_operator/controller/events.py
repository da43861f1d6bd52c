"""Events on an FSDPTraining: what changed, as ``kubectl describe`` and ``kubectl get events`` show it.

Inside a kopf handler they go through kopf's queue (posted in the
background, off the reconcile path); outside one (the pod loop) they are
created directly with the operator's client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from fsdp_api import API_VERSION, KIND

from .kube import NETWORK_ERRORS, ApiError, KubeClient
from .settings import EVENT_NAME_PREFIX, REPORTING_COMPONENT, reporting_instance
from .status.compute import EventSpec, bounded

log = logging.getLogger(__name__)

Json = dict[str, Any]


def event_target(body: Mapping[str, Any]) -> Json:
    meta = body.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
    }


def post_events(body: Mapping[str, Any], events: list[EventSpec]) -> None:
    """Queue Events on the FSDPTraining; kopf posts them in the background, off the reconcile path."""
    target = event_target(body)
    meta = target["metadata"]
    for e in events:
        log.info("%s/%s: %s: %s", meta["namespace"], meta["name"], e.reason, e.message)
        # kopf types objs as its own Body view, but reads any mapping (bodies.build_object_reference).
        kopf.event(target, type=e.type, reason=e.reason, message=e.message)  # type: ignore[arg-type]


def event_object(body: Mapping[str, Any], event: EventSpec, now: datetime | None = None) -> Json:
    """A core v1 Event on the training, shaped as kopf posts them."""
    target = event_target(body)
    stamp = (now or datetime.now(UTC)).isoformat()
    message = bounded(event.message)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": target["metadata"]["namespace"], "generateName": EVENT_NAME_PREFIX},
        "involvedObject": {**target["metadata"], "apiVersion": target["apiVersion"], "kind": target["kind"]},
        "type": event.type,
        "reason": event.reason,
        "message": message,
        "action": "Update",
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": reporting_instance(),
        "source": {"component": REPORTING_COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": stamp,
    }


async def create_events(client: KubeClient, body: Mapping[str, Any], events: list[EventSpec]) -> None:
    """Post Events directly: kopf's queue (post_events) only exists inside its handlers, not in our loop."""
    meta = body.get("metadata") or {}
    for e in events:
        log.info("%s/%s: %s: %s", meta.get("namespace"), meta.get("name"), e.reason, e.message)
        try:
            await client.create(event_object(body, e))
        except (ApiError, *NETWORK_ERRORS) as err:
            log.warning(
                "could not post the %s event on %s/%s: %s", e.reason, meta.get("namespace"), meta.get("name"), err
            )
