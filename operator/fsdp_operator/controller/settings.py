"""kopf settings: storage under our API group, watch timeouts, peering, event posting."""

from __future__ import annotations

import logging
import os

import kopf
from fsdp_api.contract import GROUP

# Everything kopf writes on our objects is an annotation under our group, so
# `kubectl get -o yaml` shows who wrote it and no kopf.zalando.org keys appear.
STORAGE_PREFIX = GROUP
FINALIZER = f"{GROUP}/finalizer"
DEFAULT_PEERING_NAME = "fsdp-operator"
REPORTING_COMPONENT = "fsdp-operator"
EVENT_NAME_PREFIX = "fsdp-operator-"
# Deployed instances run with a higher peering priority than an ad-hoc one
# (a developer's `fsdp-operator run`), which therefore pauses in their favour.
PRIORITY_ENV = "FSDP_OPERATOR_PRIORITY"

# Watches. The API server closes a watch after server_timeout and kopf
# re-opens it (re-listing from the last resourceVersion). client_timeout is
# the hard stop for a stream whose end never arrives. Bookmarks come about
# every minute, so a stream silent for inactivity_timeout is dead (a cloud
# load balancer dropping idle flows, e.g. the 350 s of an AWS NLB, or a
# half-open TCP connection after an API server restart) and is re-opened.
WATCH_SERVER_TIMEOUT = 270  # an int: the API server parses timeoutSeconds as one
WATCH_CLIENT_TIMEOUT = 300.0
WATCH_CONNECT_TIMEOUT = 10.0
WATCH_INACTIVITY_TIMEOUT = 70.0
# Short API calls (patch, apply, list): long enough for a loaded API server,
# short enough that a lost request is retried within the reconcile's backoff.
REQUEST_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0


def env_int(name: str, default: int, minimum: int = 0) -> int:
    """An integer setting from the environment: ``default`` if unset or not a number, else at least ``minimum``."""
    try:
        return max(minimum, int(os.environ.get(name, default)))
    except ValueError:
        return default


def reporting_instance() -> str:
    """Who posts our Events: the pod's name in a cluster."""
    return os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or "local"


def configure(
    settings: kopf.OperatorSettings,
    *,
    peering_name: str,
    clusterwide: bool,
    priority: int | None = None,
) -> None:
    """Apply the operator's settings to kopf's settings object (called at startup)."""
    s = settings
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=STORAGE_PREFIX, key="last-handled-configuration"
    )
    # No handler needs one (deletion is garbage collection via ownerReferences),
    # but if kopf ever adds a finalizer it must be ours, not kopf.zalando.org's.
    s.persistence.finalizer = FINALIZER

    s.watching.server_timeout = WATCH_SERVER_TIMEOUT
    s.watching.client_timeout = WATCH_CLIENT_TIMEOUT
    s.watching.connect_timeout = WATCH_CONNECT_TIMEOUT
    s.watching.inactivity_timeout = WATCH_INACTIVITY_TIMEOUT
    s.networking.request_timeout = REQUEST_TIMEOUT
    s.networking.connect_timeout = CONNECT_TIMEOUT

    # The operator posts its own transition events; kopf's per-handler
    # "succeeded" chatter would double the API writes per reconcile.
    s.posting.level = logging.WARNING
    s.posting.reporting_component = REPORTING_COMPONENT
    s.posting.reporting_instance = reporting_instance()
    s.posting.event_name_prefix = EVENT_NAME_PREFIX

    s.peering.name = peering_name
    s.peering.clusterwide = clusterwide
    s.peering.stealth = True
    s.peering.priority = priority if priority is not None else int(os.environ.get(PRIORITY_ENV, "0"))

    # The served resources are fixed (our CRD and Kubeflow's), so kopf needs no
    # CRD or namespace watch, and RBAC needs no cluster-wide read of CRDs.
    # The price: a CRD installed after start-up is noticed on restart; the
    # start-up check fails fast when ours is missing, so the pod restarts.
    s.scanning.disabled = True

    # Unexpected framework errors (not API errors, which have their own
    # backoffs) are retried quickly at first.
    s.queueing.error_delays = (1, 2, 5, 10, 30, 60)
