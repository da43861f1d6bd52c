"""Entry point: ``run_operator`` starts kopf with our settings, handlers and metrics server."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import kopf

from . import settings as operator_settings
from .handlers import Options, build_registry, new_runtime
from .peering import operator_identity
from .scraper import PeeringView

log = logging.getLogger(__name__)

DEFAULT_SCRAPE_INTERVAL = 30.0
SCRAPE_INTERVAL_ENV = "FSDP_OPERATOR_SCRAPE_INTERVAL"


def run_operator(
    *,
    namespaces: Sequence[str] | None = None,
    all_namespaces: bool = False,
    liveness_endpoint: str | None = None,
    metrics_port: int | None = None,
    peering_name: str | None = None,
    standalone: bool = False,
    priority: int | None = None,
    scrape_interval: float | None = None,
    verbose: bool = False,
) -> None:
    """Run until SIGTERM/SIGINT: in ``namespaces`` (globs work) or cluster-wide (``all_namespaces``).

    ``liveness_endpoint`` is kopf's (e.g. ``http://0.0.0.0:8080/healthz``);
    ``metrics_port`` serves the operator's Prometheus metrics; instances with
    the same ``peering_name`` (default ``fsdp-operator``) pause all but the
    highest-priority one unless ``standalone``. ``priority`` defaults to
    $FSDP_OPERATOR_PRIORITY (0) and ``scrape_interval`` (seconds between reads
    of running trainers' metrics, 0 disables) to $FSDP_OPERATOR_SCRAPE_INTERVAL (30).
    """
    served = tuple(dict.fromkeys(n for n in namespaces or () if n))
    peering_name = peering_name or operator_settings.DEFAULT_PEERING_NAME
    if bool(served) == bool(all_namespaces):
        raise ValueError("pass exactly one of: namespaces to serve, or all_namespaces=True")
    clusterwide = bool(all_namespaces)
    if scrape_interval is None:
        scrape_interval = float(os.environ.get(SCRAPE_INTERVAL_ENV, DEFAULT_SCRAPE_INTERVAL))

    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.FULL)
    if not verbose:
        # kopf logs every handler run at INFO: per job status change, that is noise.
        # Failures still show (WARNING+), and our own transitions log at INFO.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    settings = kopf.OperatorSettings()
    operator_settings.configure(settings, peering_name=peering_name, clusterwide=clusterwide, priority=priority)
    if any(ch in n for n in served for ch in "*?[!"):
        # Patterns need kopf to list and watch namespaces (and the RBAC for it).
        settings.scanning.disabled = False
    identity = operator_identity()
    peering_view = (
        None
        if standalone
        else PeeringView(
            name=peering_name, clusterwide=clusterwide, identity=identity, priority=settings.peering.priority
        )
    )
    runtime = new_runtime(settings)
    registry = build_registry(
        runtime,
        Options(clusterwide=clusterwide, namespaces=served, peering=peering_view, scrape_interval=scrape_interval),
    )
    if metrics_port:
        runtime.metrics.serve(metrics_port)
    log.info(
        "fsdp-operator starting: %s, peering %s (priority %d, id %s)",
        "cluster-wide" if clusterwide else f"namespaces {', '.join(served)}",
        "off" if standalone else repr(peering_name),
        settings.peering.priority,
        identity,
    )
    kopf.run(
        registry=registry,
        settings=settings,
        identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        clusterwide=clusterwide,
        namespaces=list(served),
        liveness_endpoint=liveness_endpoint,
        standalone=standalone,
        peering_name=None if standalone else peering_name,
        priority=settings.peering.priority,
    )
