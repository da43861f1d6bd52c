"""Suspect nodes: what a node's own conditions say of the hardware and system under a training.

The EKS node monitoring agent (aws/eks-node-monitoring-agent) sets one
condition per category on every node it watches: ``KernelReady``,
``NetworkingReady``, ``StorageReady``, ``AcceleratedHardwareReady`` (GPU XIDs,
DCGM diagnostics, Neuron) and ``ContainerRuntimeReady``, ``False`` when it found
a problem, with the reason and message saying which. A training whose pods run
on such a node is told in its status (``NodesHealthy=False``, naming the node,
its pods and each condition's reason and message) and by a Warning Event. A
rank that keeps its peers waiting (stragglers.py), a new GPU XID (xids.py)
and repeated failures or stalls of the training there (incidents.py) make
its node a suspect the same way. The verdict alerts; it does not move the training
(docs/operator.md, "Bad nodes").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..bodies import NodeView, PodView

Json = Mapping[str, Any]

# The node monitoring agent's conditions (README of aws/eks-node-monitoring-agent); False is a problem.
SUSPECT_CONDITIONS = (
    "AcceleratedHardwareReady",
    "NetworkingReady",
    "KernelReady",
    "StorageReady",
    "ContainerRuntimeReady",
)
# How many suspect nodes one message names before it counts the rest.
NAMED_NODES = 3


@dataclass(frozen=True)
class SuspectNode:
    node: str
    pods: tuple[str, ...]
    evidence: tuple[str, ...]  # "AcceleratedHardwareReady=False (NvidiaXID79Error: ...)"
    # Whether any evidence is the node's own (its conditions, dcgm-exporter's XIDs) rather than
    # the training's (its ranks' lateness from its own /metrics, its containers' failures): only
    # node-side evidence excludes a node unless the operator's admin allows the rest (controller/node_exclusion.py).
    node_side: bool = True

    def line(self) -> str:
        return f"node {self.node} (pods {', '.join(self.pods)}): {'; '.join(self.evidence)}"


@dataclass(frozen=True)
class NodeHealth:
    """One look at the nodes under a training's pods."""

    nodes: int  # the nodes looked at
    suspects: tuple[SuspectNode, ...]
    conditions: bool = True  # the nodes' conditions were read
    lateness: bool = False  # the ranks' lateness was read (stragglers.py)
    xids: bool = False  # Prometheus was asked for new GPU XIDs (xids.py)
    note: str | None = None  # what was done about the suspects (controller/node_exclusion.py)

    @property
    def healthy(self) -> bool:
        return not self.suspects

    def message(self) -> str:
        if self.healthy:
            found = [
                *(["no node condition reports a problem"] if self.conditions else []),
                *(["no GPU reported a new XID"] if self.xids else []),
                *(["no rank keeps its peers waiting"] if self.lateness else []),
            ]
            said = ", ".join(found[:-1]) + " and " + found[-1] if len(found) > 1 else found[0]
            return f"{said} on the {self.nodes} node(s) of the training's pods"
        lines = [s.line() for s in self.suspects[:NAMED_NODES]]
        more = len(self.suspects) - NAMED_NODES
        text = "; ".join(lines) + (f"; and {more} more node(s)" if more > 0 else "")
        return f"{text}; {self.note}" if self.note else text


def evidence(node: Json) -> tuple[str, ...]:
    """The node's problem conditions, as ``Type=False (reason: message)``."""
    out = []
    for c in NodeView.of(node).conditions:
        if c.type in SUSPECT_CONDITIONS and c.status == "False":
            why = ": ".join(x for x in (c.reason, c.message) if x)
            out.append(f"{c.type}=False" + (f" ({why})" if why else ""))
    return tuple(out)


def node_health(
    pods: Iterable[Json],
    nodes: Mapping[str, Json] | None,
    stragglers: Mapping[str, list[str]] | None = None,
    xids: Mapping[str, list[str]] | None = None,
    incidents: Mapping[str, list[str]] | None = None,
) -> NodeHealth | None:
    """The verdict for these (live) pods; None when no pod has a node yet, or nothing was read.

    ``nodes``: the nodes by name (None: they may not be read); ``stragglers``:
    per node, its straggling ranks (None: the ranks' lateness was not read);
    ``xids``: per node, its GPUs' new XIDs (None: no Prometheus was asked);
    ``incidents``: per node, its repeated failures and stalls (incidents.py).
    """
    if nodes is None and stragglers is None and xids is None and not incidents:
        return None
    on: dict[str, list[str]] = {}
    for pod in map(PodView.of, pods):
        if pod.node_name:
            on.setdefault(pod.node_name, []).append(pod.name)
    if not on:
        return None

    def node_side(name: str) -> tuple[str, ...]:
        own = evidence(nodes[name]) if nodes and name in nodes else ()
        return own + tuple((xids or {}).get(name, ()))

    def workload_side(name: str) -> tuple[str, ...]:
        return tuple(line for found in (stragglers, incidents) for line in (found or {}).get(name, ()))

    suspects = [
        SuspectNode(name, tuple(sorted(on[name])), node + workload, node_side=bool(node))
        for name in sorted(on)
        if (node := node_side(name)) + (workload := workload_side(name))
    ]
    return NodeHealth(
        len(on),
        tuple(suspects),
        conditions=nodes is not None,
        lateness=stragglers is not None,
        xids=xids is not None,
    )
