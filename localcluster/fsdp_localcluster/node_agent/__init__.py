"""The node agent: the local cluster's kubelet and container runtime, running pods as local processes.

``agent`` registers Karpenter-shaped nodes and dispatches the pods bound to
them; ``pods`` runs one pod, ``runs`` one container's processes; ``network`` is the pod network on loopback (pod
IPs, cluster DNS, the Python shim) and ``bind_shim`` its native half; ``client`` is the small API client they
share. docs/e2e.md describes what is emulated and how.
"""

from .agent import GPU_TAINT, NodeAgent, NodeSpec, karpenter_node
from .network import POD_IP_ENV, SITECUSTOMIZE, PodNetwork
from .pod_sources import NotReady
from .pods import PodContext, PodWorker, expand, rewrite_paths
from .runs import CONTAINER_MARKER, ContainerRun, container_pids

__all__ = [
    "CONTAINER_MARKER",
    "GPU_TAINT",
    "POD_IP_ENV",
    "SITECUSTOMIZE",
    "ContainerRun",
    "NodeAgent",
    "NodeSpec",
    "NotReady",
    "PodContext",
    "PodNetwork",
    "PodWorker",
    "container_pids",
    "expand",
    "karpenter_node",
    "rewrite_paths",
]
