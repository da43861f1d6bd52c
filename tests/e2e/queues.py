"""Kueue objects of the end-to-end tests: a namespace's ClusterQueue, LocalQueue and priority classes."""

from __future__ import annotations

import re
from typing import Any

GPU_QUOTA = 2
INSUFFICIENT = re.compile(r"insufficient (unused )?quota for nvidia.com/gpu")


def queue_objects(ns: str) -> list[dict[str, Any]]:
    kueue = "kueue.x-k8s.io/v1beta2"
    return [
        {"apiVersion": kueue, "kind": "ResourceFlavor", "metadata": {"name": "gpu"}, "spec": {}},
        {
            "apiVersion": kueue,
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
                                "name": "gpu",
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
            "apiVersion": kueue,
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": ns},
            "spec": {"clusterQueue": ns},
        },
        {"apiVersion": kueue, "kind": "WorkloadPriorityClass", "metadata": {"name": "low"}, "value": 10},
        {"apiVersion": kueue, "kind": "WorkloadPriorityClass", "metadata": {"name": "high"}, "value": 1000},
    ]
