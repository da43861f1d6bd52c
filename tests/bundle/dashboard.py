"""The Grafana dashboard's queries, and their template variables substituted for a real Prometheus."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fsdp_api.contract import GPU_SERIES as GPU_ONLY

from tests.bundle.manifests import DASHBOARD, metric_names


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str

    @property
    def metrics(self) -> set[str]:
        return metric_names(self.expr)

    def gpu_only(self) -> bool:
        """Reads a metric that exists only on GPU nodes (dcgm-exporter, the trainer's NVML gauges)."""
        return bool(self.metrics & GPU_ONLY)

    def substituted(
        self, namespace: str, job: str, node: str = ".*", rate_interval: str = "1m", time_range: str = "1h"
    ) -> str:
        """The expression as Grafana sends it, for these variable values ("All" nodes is .*)."""
        return (
            self.expr.replace("$namespace", namespace)
            .replace("$job", job)
            .replace("$node", node)
            .replace("$__rate_interval", rate_interval)
            .replace("$__range", time_range)
        )


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out = []
    for p in (dash or load())["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def queries(dash: dict[str, Any] | None = None) -> list[Query]:
    return [
        Query(p["title"], t["refId"], t["expr"]) for p in panels(dash) for t in p.get("targets", []) if t.get("expr")
    ]


def variables(dash: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in (dash or load())["templating"]["list"]}
