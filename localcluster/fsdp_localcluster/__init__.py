"""A whole Kubernetes cluster on one machine, for tests, the demo and benchmarks.

Every component is the real one, run as a local process on loopback; the
node agent stands in for the kubelet and the container runtime where a test
needs many nodes cheaply, and a real kubelet runs where it needs the real one:

- ``binaries``: where the Go-built binaries (etcd, kube-apiserver, kubectl,
  helm, kube-scheduler, kube-controller-manager, kubelet, the Kubeflow
  training operator, Kueue, Trainer v2, JobSet, versitygw) come from;
- ``pki``: the certificates, made with the openssl CLI;
- ``apiserver``: ``TestCluster``, etcd + kube-apiserver (RBAC on) with kubectl helpers;
- ``control_plane``: ``ControlPlane``, kube-scheduler, kube-controller-manager
  and the Kubeflow training operator;
- ``kueue``: ``Kueue``, and ``trainer_v2``: ``TrainerV2`` (Kubeflow Trainer v2
  with JobSet), controllers added next to a running ControlPlane;
- ``node_agent``: ``NodeAgent``, Karpenter-shaped nodes whose pods run as processes;
- ``kubelet_node``: a real kubelet on containerd, running the built images;
- ``images``: the images `make images` builds from the Dockerfile, by their local names;
- ``s3``: ``S3Server``, versitygw on loopback (a real S3 API for the remote tier);
- ``webhooks``: the controllers' admission webhooks, registered by URL on loopback;
- ``operator_install``: the fsdp-operator from kustomize/default, as a pod or
  as a child process (``OperatorProcess``);
- ``prometheus``: a real Prometheus server;
- ``whole_cluster``: ``WholeCluster``, all of the above together;
- ``wait``: ``wait_for``, the one bounded wait.

For example::

    from fsdp_localcluster import WholeCluster, wait_for

    with WholeCluster() as whole:
        whole.install_operator()
        whole.cluster.apply("examples/fsdptraining-tiny.yaml")
        wait_for(lambda: whole.get("pytorchjob", "tiny", "default"), 60, "the PyTorchJob")

docs/test-cluster.md and docs/e2e.md describe the pieces.
"""

from .apiserver import KubectlError, TestCluster
from .binaries import REPO_ROOT, tool_path
from .control_plane import ControlPlane
from .node_agent import NodeAgent, NodeSpec, karpenter_node
from .operator_install import OperatorInstall, OperatorProcess, install_operator
from .prometheus import PrometheusServer
from .wait import WaitTimeout, wait_for
from .whole_cluster import WholeCluster, machine_lock

__all__ = [
    "REPO_ROOT",
    "ControlPlane",
    "KubectlError",
    "NodeAgent",
    "NodeSpec",
    "OperatorInstall",
    "OperatorProcess",
    "PrometheusServer",
    "TestCluster",
    "WaitTimeout",
    "WholeCluster",
    "install_operator",
    "karpenter_node",
    "machine_lock",
    "tool_path",
    "wait_for",
]
