"""What the operator may do to nodes, on a real API server.

components/node-reader and the chart's readNodes: list nodes and nothing more, in the namespaced install too
(RBAC's authorizer, ``kubectl auth can-i --as``); components/node-exclusion: patch nodes; and
components/node-excluder-policy, the admission policy that holds that patch to the operator's own taint,
label and annotations (its CEL run by the API server on the operator's own patches)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Iterator

import kopf
import pytest
import yaml
from fsdp_api.contract import EXCLUDED_NODE_TAINT
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.wait import wait_for
from fsdp_operator.controller.kube import ApiError, KubeClient
from fsdp_operator.controller.node_exclusion import lift_patch, taint_patch

from tests.bundle.manifests import KUSTOMIZE, helm_template, kustomize

pytestmark = pytest.mark.cluster

BINDING = KUSTOMIZE / "components" / "node-reader" / "cluster_role_binding.yaml"
OPERATOR = "system:serviceaccount:fsdp-system:fsdp-operator"
RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding")


@pytest.fixture(scope="module")
def rbac_cluster() -> Iterator[TestCluster]:
    """An API server of its own: the bindings made here are cluster-wide."""
    with TestCluster(crds=[]) as cluster:
        yield cluster


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


POLICY_DIR = KUSTOMIZE / "components" / "node-excluder-policy"
CORDONED = {"spec": {"unschedulable": True}}
GONE_OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}


def node_object(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "gpu"}, "annotations": {"site": "a"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
    }


def patch_node(cluster: TestCluster, name: str, patch: dict, *, as_operator: bool = True) -> str:
    """A merge patch sent by the operator's own client (as its ServiceAccount, with a token of its own) or by the
    admin: '' when admitted, else the API server's message."""
    if not as_operator:
        res = cluster.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps(patch), check=False)
        return "" if res.returncode == 0 else res.stderr.strip()
    namespace, account = OPERATOR.split(":")[2:]
    kubeconfig = cluster.serviceaccount_kubeconfig(namespace, account)

    async def send() -> str:
        client = KubeClient(lambda: kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        try:
            await client.merge_patch("v1", "Node", None, name, patch)
            return ""
        except ApiError as e:
            return f"{e.status} {e.message}"
        finally:
            await client.close()

    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        return asyncio.run(send())
    finally:
        os.environ.pop("KUBECONFIG") if previous is None else os.environ.__setitem__("KUBECONFIG", previous)


def test_the_node_excluder_policy_admits_the_operators_patches_and_refuses_every_other_change(
    rbac_cluster: TestCluster,
) -> None:
    """components/node-excluder-policy on a real API server: RBAC's `patch nodes` allows any field; the policy
    lets the operator's ServiceAccount change its own taint, label and annotations and nothing else."""
    objs = [o for o in kustomize("default") if o["kind"] in RBAC_KINDS]
    rbac_cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objs))
    rbac_cluster.kubectl("apply", "--server-side", "-f", str(EXCLUDER))
    name = "policy-gpu-1"
    try:
        wait_for(lambda: can_i(rbac_cluster, "patch", "nodes") == "yes", 30, "the node-excluder binding")
        rbac_cluster.kubectl("create", "-f", "-", input=json.dumps(node_object(name)))
        # Without the policy RBAC lets the operator's ServiceAccount cordon the node.
        assert patch_node(rbac_cluster, name, CORDONED) == ""
        rbac_cluster.kubectl("patch", "node", name, "--type=merge", "-p", '{"spec":{"unschedulable":null}}')

        rbac_cluster.kubectl("apply", "--server-side", "-k", str(POLICY_DIR))
        # In force once a fresh label is refused (a patch that changes nothing would pass any rule).
        probes = itertools.count()
        wait_for(
            lambda: (
                "may change only its own label"
                in patch_node(rbac_cluster, name, {"metadata": {"labels": {"probe": str(next(probes))}}})
            ),
            30,
            "the policy in force",
        )
        rbac_cluster.kubectl("label", "node", name, "probe-")

        # The operator's own patches, as its code builds them, pass.
        before = json.loads(rbac_cluster.kubectl("get", "node", name, "-o", "json").stdout)
        assert patch_node(rbac_cluster, name, taint_patch(before, "2026-12-03T01:00:00Z", "ml/llama: XID 79")) == ""
        tainted = json.loads(rbac_cluster.kubectl("get", "node", name, "-o", "json").stdout)
        assert tainted["spec"]["taints"][:-1] == before["spec"]["taints"]  # the others kept, in their order
        assert tainted["spec"]["taints"][-1] == {"key": EXCLUDED_NODE_TAINT, "value": "suspect", "effect": "NoSchedule"}
        assert tainted["metadata"]["labels"][EXCLUDED_NODE_TAINT] == "true"
        assert patch_node(rbac_cluster, name, lift_patch(tainted)) == ""
        lifted = json.loads(rbac_cluster.kubectl("get", "node", name, "-o", "json").stdout)
        assert (lifted["spec"]["taints"], lifted["metadata"]["labels"], lifted["metadata"]["annotations"]) == (
            before["spec"]["taints"],
            before["metadata"]["labels"],
            before["metadata"]["annotations"],
        )

        ours = {"key": EXCLUDED_NODE_TAINT, "value": "suspect"}
        refused = {
            "fsdp-operator may add or remove only its own taint": {"spec": {"taints": []}},
            "fsdp-operator's taint is training.fsdp.dev/excluded=suspect:NoSchedule": {
                "spec": {"taints": [*before["spec"]["taints"], {**ours, "effect": "NoExecute"}]}
            },
            "fsdp-operator may change only its own label": {"metadata": {"labels": {"karpenter.sh/nodepool": "x"}}},
            "fsdp-operator may change only its own annotations": {"metadata": {"annotations": {"site": None}}},
            "fsdp-operator may not cordon or uncordon": CORDONED,
            "fsdp-operator may not change finalizers": {"metadata": {"finalizers": ["example.com/hold"]}},
            "fsdp-operator may not change owner references": {"metadata": {"ownerReferences": [GONE_OWNER]}},
        }
        for message, patch in refused.items():
            assert message in patch_node(rbac_cluster, name, patch), message
        after = json.loads(rbac_cluster.kubectl("get", "node", name, "-o", "json").stdout)
        assert (after["spec"], after["metadata"]["labels"]) == (lifted["spec"], lifted["metadata"]["labels"])
        # Anyone else (here the admin) is not matched.
        assert (
            patch_node(rbac_cluster, name, {"metadata": {"labels": {"karpenter.sh/nodepool": "x"}}}, as_operator=False)
            == ""
        )
    finally:
        rbac_cluster.kubectl("delete", "-k", str(POLICY_DIR), "--ignore-not-found")
        rbac_cluster.kubectl("delete", "node", name, "--ignore-not-found")
        rbac_cluster.kubectl("delete", "-f", str(EXCLUDER))
        wait_for(lambda: can_i(rbac_cluster, "patch", "nodes") == "no", 30, "the binding gone")


def test_the_chart_renders_the_same_policy_for_its_own_service_account() -> None:
    component = {o["kind"]: o for o in kustomize("components/node-excluder-policy")}
    assert component["ValidatingAdmissionPolicy"]["spec"]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username == '{OPERATOR}'"
    )
    values = {"excludeNodes": "true", "nodeExcluderPolicy": "true"}
    chart = {o["kind"]: o for o in helm_template(values, namespace="ml") if o["kind"].startswith("ValidatingAdmission")}
    policy = chart["ValidatingAdmissionPolicy"]["spec"]
    expected = json.loads(
        json.dumps(component["ValidatingAdmissionPolicy"]["spec"]).replace(
            OPERATOR, "system:serviceaccount:ml:fsdp-operator"
        )
    )
    assert policy == expected
    assert (
        chart["ValidatingAdmissionPolicyBinding"]["spec"]["policyName"]
        == chart["ValidatingAdmissionPolicy"]["metadata"]["name"]
    )
    assert not [
        o
        for o in helm_template({"nodeExcluderPolicy": "true"}, namespace="ml")
        if o["kind"].startswith("ValidatingAdmission")
    ]
