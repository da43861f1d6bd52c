"""The PodMonitor (monitoring.coreos.com/v1) that scrapes every trainer pod."""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import MONITORING_API_VERSION, PODMONITOR_KIND

from .. import naming

API_VERSION = MONITORING_API_VERSION
KIND = PODMONITOR_KIND
SCRAPE_INTERVAL = "15s"
# Series a trainer pod may not export under these names: the operator reads
# DCGM_* (XID errors) as node-side evidence from dcgm-exporter, and a pod that
# exported DCGM_FI_DEV_XID_ERRORS{Hostname="another-node"} would make another
# tenant's node suspect. Dropped at the scrape, before they are stored.
RESERVED_SERIES = "DCGM_.*"
DROP_RESERVED = {"sourceLabels": ["__name__"], "regex": RESERVED_SERIES, "action": "drop"}


def pod_monitor(spec: FSDPTrainingSpec, name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": naming.labels(name, naming.METRICS),
        },
        "spec": {
            "selector": {"matchLabels": naming.pod_selector(name)},
            "podMetricsEndpoints": [
                # The port is referenced by name so a spec.metrics.port change
                # needs no PodMonitor change.
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    "metricRelabelings": [DROP_RESERVED],
                }
            ],
        },
    }
