"""The operator's own Prometheus metrics, on a registry of their own.

A private registry keeps the endpoint to what is documented here (no
process/platform collectors a second time if another library registered
them) and lets tests build a fresh one.
"""

from __future__ import annotations

import contextlib
from collections import Counter as Tally
from collections.abc import Iterable, Iterator

from fsdp_api.contract import LABEL_JOB_NAME, OPERATOR_NODE_EXCLUSIONS
from fsdp_api.status import Phase
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PHASES: tuple[Phase, ...] = ("Pending", "Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
# Reconciles are API round-trips on a healthy cluster (ms) up to retries under load (s).
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LABEL_NAMESPACE = "namespace"
# creationTimestamp has one-second resolution, so sub-second buckets would be noise.
CREATE_TO_JOB_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _PhaseCollector(Collector):
    """``fsdp_operator_trainings{phase}``, counted at scrape time from the operator's view."""

    def __init__(self, phases: dict[str, str]) -> None:
        self._phases = phases

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "fsdp_operator_trainings", "FSDPTrainings managed by this operator, by status phase.", labels=["phase"]
        )
        counts = Tally(self._phases.values())
        for phase in PHASES:
            family.add_metric([phase], counts.get(phase, 0))
        yield family


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # uid -> phase; the handlers keep it current, the collector reads it.
        self.phases: dict[str, str] = {}
        self.reconciles = Counter(
            "fsdp_operator_reconciles",
            "Reconciles of FSDPTrainings (apply of the rendered objects), by result.",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "fsdp_operator_reconcile_duration_seconds",
            "Time to render and apply one FSDPTraining's objects and update its status.",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.status_updates = Counter(
            "fsdp_operator_status_updates",
            "Status patches written to FSDPTrainings, by what triggered them.",
            ["source"],
            registry=self.registry,
        )
        self.create_to_job = Histogram(
            "fsdp_operator_create_to_job_seconds",
            "From the FSDPTraining's creationTimestamp to its PyTorchJob being created by this operator.",
            buckets=CREATE_TO_JOB_BUCKETS,
            registry=self.registry,
        )
        self.scrapes = Counter(
            "fsdp_operator_trainer_scrapes",
            "Reads of a trainer's metrics endpoint for the status, by result.",
            ["result"],
            registry=self.registry,
        )
        self.node_exclusions = Counter(
            OPERATOR_NODE_EXCLUSIONS,
            "Nodes a training excluded as suspects (spec.health.onSuspectNode exclude).",
            [LABEL_NAMESPACE, LABEL_JOB_NAME],
            registry=self.registry,
        )
        for result in ("success", "error", "invalid"):
            self.reconciles.labels(result)
        for source in ("apply", "job", "progress"):
            self.status_updates.labels(source)
        self.registry.register(_PhaseCollector(self.phases))

    def forget(self, uids: Iterable[str]) -> None:
        for uid in uids:
            self.phases.pop(uid, None)

    def watch_exclusions(self, namespace: str, job_name: str) -> None:
        """A 0 for the training's exclusions, so that increase() sees its first one."""
        self.node_exclusions.labels(namespace, job_name)

    def forget_exclusions(self, namespace: str, job_name: str) -> None:
        with contextlib.suppress(KeyError):  # never watched (a training the operator did not see)
            self.node_exclusions.remove(namespace, job_name)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics from a daemon thread (prometheus_client's own server)."""
        start_http_server(port, addr=addr, registry=self.registry)
