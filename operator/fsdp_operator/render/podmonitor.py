"""The PodMonitor (monitoring.coreos.com/v1) that scrapes every trainer pod."""

from __future__ import annotations

from typing import Any

from ..api import FSDPTrainingSpec
from . import names

API_VERSION = "monitoring.coreos.com/v1"
KIND = "PodMonitor"
SCRAPE_INTERVAL = "15s"


def pod_monitor(spec: FSDPTrainingSpec, name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": names.labels(name, names.METRICS),
        },
        "spec": {
            "selector": {"matchLabels": names.pod_selector(name)},
            "podMetricsEndpoints": [
                # The port is referenced by name so a spec.metrics.port change
                # needs no PodMonitor change.
                {"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL}
            ],
        },
    }
