"""Kueue objects of the end-to-end tests: a namespace's ClusterQueue, LocalQueue and priority classes."""

from __future__ import annotations

import re
from typing import Any

from fsdp_api.contract import EKS_NETWORK_LAYER_LABEL, HOSTNAME_LABEL

GPU_QUOTA = 2
INSUFFICIENT = re.compile(r"insufficient (unused )?quota for nvidia.com/gpu")


KUEUE = "kueue.x-k8s.io/v1beta2"
# The Topology of the local cluster's GPU nodes: EKS's network layers, then the node.
EKS_TOPOLOGY = "eks-network"
TOPOLOGY_LEVELS = [EKS_NETWORK_LAYER_LABEL.format(n) for n in (1, 2, 3)] + [HOSTNAME_LABEL]


def topology_objects() -> list[dict[str, Any]]:
    """A Topology of EKS's network layers and a ResourceFlavor "gpu-tas" of the GPU NodePool on it."""
    return [
        {
            "apiVersion": KUEUE,
            "kind": "Topology",
            "metadata": {"name": EKS_TOPOLOGY},
            "spec": {"levels": [{"nodeLabel": label} for label in TOPOLOGY_LEVELS]},
        },
        {
            "apiVersion": KUEUE,
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu-tas"},
            # A topology flavor needs node labels: the nodes whose capacity it counts.
            "spec": {"nodeLabels": {"karpenter.sh/nodepool": "gpu"}, "topologyName": EKS_TOPOLOGY},
        },
    ]


def queue_objects(ns: str, flavor: str = "gpu") -> list[dict[str, Any]]:
    """``flavor`` "gpu-tas" (topology_objects) makes it a queue for topology-aware trainings."""
    plain = [{"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "gpu"}, "spec": {}}]
    return [
        *(topology_objects() if flavor == "gpu-tas" else plain),
        {
            "apiVersion": KUEUE,
            "kind": "ClusterQueue",
            "metadata": {"name": ns},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                # A higher WorkloadPriorityClass evicts a lower one to fit.
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        # Kueue admits only what its ClusterQueue covers: every resource the pods request.
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "10k"},
                                    {"name": "memory", "nominalQuota": "100Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": str(GPU_QUOTA)},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": ns},
            "spec": {"clusterQueue": ns},
        },
        {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": "low"}, "value": 10},
        {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": "high"}, "value": 1000},
    ]
