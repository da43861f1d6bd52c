"""The trainer's metrics endpoint and the NetworkPolicy that says who may reach it."""

from __future__ import annotations

from pydantic import Field

from ..base import ApiModel
from ..contract import METRICS_PORT
from .values import NamespaceName


class MetricsSpec(ApiModel):
    """The trainer's Prometheus endpoint (one per pod, covering all local ranks)."""

    enabled: bool = Field(default=True, description="Serve Prometheus metrics and emit a PodMonitor.")
    port: int = Field(default=METRICS_PORT, ge=1024, le=65535, description="Port of the metrics endpoint in each pod.")


class NetworkPolicySpec(ApiModel):
    """A NetworkPolicy around the job's pods: only the job's pods and, on the metrics port, listed namespaces."""

    enabled: bool = Field(
        default=True,
        description=(
            "Emit the NetworkPolicy. It is enforced only where the cluster's network plugin implements "
            "NetworkPolicy (on EKS: the VPC CNI with network policy enabled, or Calico/Cilium)."
        ),
    )
    metrics_from_namespaces: list[NamespaceName] = Field(
        default_factory=lambda: ["fsdp-system", "monitoring"],
        max_length=32,
        description="Namespaces whose pods may read the metrics port: the operator's and Prometheus'.",
    )
