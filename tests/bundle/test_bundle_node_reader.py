"""components/node-reader and the chart's readNodes: the operator may list nodes, and nothing more, in the
namespaced install too. Checked by a real API server's RBAC authorizer (``kubectl auth can-i --as``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.wait import wait_for

from tests.bundle.manifests import KUSTOMIZE, helm_template, kustomize

pytestmark = pytest.mark.cluster

BINDING = KUSTOMIZE / "components" / "node-reader" / "cluster_role_binding.yaml"
OPERATOR = "system:serviceaccount:fsdp-system:fsdp-operator"
RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding")


@pytest.fixture(scope="module")
def rbac_cluster() -> Iterator[TestCluster]:
    """An API server of its own: the bindings made here are cluster-wide."""
    cluster = TestCluster(crds=[])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def can_i(cluster: TestCluster, *args: str) -> str:
    res = cluster.kubectl("auth", "can-i", *args, f"--as={OPERATOR}", check=False)
    return res.stdout.strip()


def test_the_namespaced_install_lists_nodes_only_with_the_component(rbac_cluster: TestCluster) -> None:
    objs = [o for o in kustomize("default") if o["kind"] in RBAC_KINDS]
    assert not [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    rbac_cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objs))
    wait_for(lambda: can_i(rbac_cluster, "list", "pods", "-n", "fsdp-training") == "yes", 30, "the RoleBinding")
    assert can_i(rbac_cluster, "list", "nodes") == "no"

    rbac_cluster.kubectl("apply", "--server-side", "-f", str(BINDING))
    wait_for(lambda: can_i(rbac_cluster, "list", "nodes") == "yes", 30, "the node-reader binding")
    # Only that: no single node, no watch, no writes, nothing new in other namespaces.
    for args in (
        ("get", "nodes"),
        ("watch", "nodes"),
        ("patch", "nodes"),
        ("list", "pods", "-n", "kube-system"),
        ("get", "configmaps", "-n", "kube-system"),
        ("create", "clusterrolebindings"),
    ):
        assert can_i(rbac_cluster, *args) == "no", args


def test_the_chart_binds_the_same_role_with_read_nodes() -> None:
    def node_reader(objs: list[dict]) -> dict[str, dict]:
        return {o["kind"]: o for o in objs if o["metadata"]["name"] == "fsdp-operator-node-reader"}

    component = yaml.safe_load(BINDING.read_text())
    overlay = node_reader(kustomize("overlays/clusterwide"))
    assert overlay["ClusterRoleBinding"] == component
    plain = node_reader(helm_template(namespace="fsdp-system"))
    assert set(plain) == {"ClusterRole"}  # unbound unless asked for
    chart = node_reader(helm_template({"readNodes": "true"}, namespace="fsdp-system"))
    assert chart["ClusterRole"]["rules"] == overlay["ClusterRole"]["rules"]
    assert chart["ClusterRoleBinding"]["roleRef"] == component["roleRef"]
    assert chart["ClusterRoleBinding"]["subjects"] == component["subjects"]
    # The operator's own ClusterRole stays bound per namespace.
    kinds = [o["kind"] for o in helm_template({"readNodes": "true"}, namespace="fsdp-system")]
    assert kinds.count("ClusterRoleBinding") == 1 and "RoleBinding" in kinds


EXCLUDER = KUSTOMIZE / "components" / "node-exclusion" / "cluster_role_binding.yaml"


def test_node_exclusion_adds_patch_nodes_and_nothing_else(rbac_cluster: TestCluster) -> None:
    """components/node-exclusion (spec.health.onSuspectNode exclude): taint nodes, no other write."""
    objs = [o for o in kustomize("default") if o["kind"] in RBAC_KINDS]
    rbac_cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objs))
    rbac_cluster.kubectl("apply", "--server-side", "-f", str(EXCLUDER))
    try:
        wait_for(lambda: can_i(rbac_cluster, "patch", "nodes") == "yes", 30, "the node-excluder binding")
        for args in (
            ("update", "nodes"),
            ("delete", "nodes"),
            ("patch", "nodes", "--subresource=status"),
            ("create", "pods/eviction", "-n", "kube-system"),
        ):
            assert can_i(rbac_cluster, *args) == "no", args
    finally:
        rbac_cluster.kubectl("delete", "-f", str(EXCLUDER))
        wait_for(lambda: can_i(rbac_cluster, "patch", "nodes") == "no", 30, "the binding gone")
    # The chart's excludeNodes renders the same role and binding, and binds the node reader with it.
    component = yaml.safe_load(EXCLUDER.read_text())
    overlay_role = next(o for o in kustomize("default") if o["metadata"]["name"] == "fsdp-operator-node-excluder")
    chart = {
        (o["kind"], o["metadata"]["name"]): o
        for o in helm_template({"excludeNodes": "true"}, namespace="fsdp-system")
        if o["kind"].startswith("Cluster")
    }
    assert chart["ClusterRole", "fsdp-operator-node-excluder"]["rules"] == overlay_role["rules"]
    binding = chart["ClusterRoleBinding", "fsdp-operator-node-excluder"]
    assert (binding["roleRef"], binding["subjects"]) == (component["roleRef"], component["subjects"])
    assert ("ClusterRoleBinding", "fsdp-operator-node-reader") in chart
    plain = {(o["kind"], o["metadata"]["name"]) for o in helm_template(namespace="fsdp-system")}
    assert ("ClusterRoleBinding", "fsdp-operator-node-excluder") not in plain
