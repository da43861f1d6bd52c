"""The NetworkPolicy (networking.k8s.io/v1) that fences in a job's pods.

The rendezvous store (port 29400) and the process group's TCP connections
carry no authentication: any pod that reaches them can join or disrupt the
job. The policy admits only the job's own pods, on every port (NCCL and gloo
pick ephemeral ports), and, on the metrics port only, pods of the namespaces
in ``spec.networkPolicy.metricsFromNamespaces`` (the operator reads the step
from there, Prometheus scrapes it). Egress is left open: the trainer may
need the hub, S3, DNS. EFA traffic does not pass through the kernel's IP
stack and is not subject to NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec
from fsdp_api.contract import NAMESPACE_NAME_LABEL, NETWORKPOLICY_API_VERSION, NETWORKPOLICY_KIND

from .. import naming


def network_policy(spec: FSDPTrainingSpec, name: str, namespace: str) -> dict[str, Any]:
    job_pods = {"podSelector": {"matchLabels": naming.pod_selector(name)}}
    ingress: list[dict[str, Any]] = [{"from": [job_pods]}]
    allowed = spec.network_policy.metrics_from_namespaces
    if spec.metrics.enabled and allowed:
        selector = {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(allowed)}]}
        ingress.append(
            {"from": [{"namespaceSelector": selector}], "ports": [{"protocol": "TCP", "port": spec.metrics.port}]}
        )
    return {
        "apiVersion": NETWORKPOLICY_API_VERSION,
        "kind": NETWORKPOLICY_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name, naming.NETWORK_POLICY)},
        "spec": {
            "podSelector": {"matchLabels": naming.pod_selector(name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
