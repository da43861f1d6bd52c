"""The test cluster itself behaves like a real control plane: schemas, CEL, RBAC, restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.wait import wait_for

from tests.cluster.crds import write_crd

pytestmark = pytest.mark.cluster

SHARED_CRDS = [
    "pytorchjobs.kubeflow.org",
    "nodepools.karpenter.sh",
    "nodeclaims.karpenter.sh",
    "ec2nodeclasses.karpenter.k8s.aws",
    "podmonitors.monitoring.coreos.com",
    "servicemonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
]


def pytorchjob(name: str, run_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """A minimal PyTorchJob: one Master replica with the `pytorch` container."""
    template = {"spec": {"containers": [{"name": "pytorch", "image": "busybox:1.36"}]}}
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}}}
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name}, "spec": spec}


def test_readyz_ok(cluster: TestCluster) -> None:
    assert cluster.readyz() == "ok"
    assert "[+]etcd ok" in cluster.readyz(verbose=True)


def test_server_version_matches_pin(cluster: TestCluster) -> None:
    versions = Path(__file__).resolve().parents[2] / "tools" / "versions.env"
    pinned = dict(line.split("=", 1) for line in versions.read_text().splitlines() if line and line[0] != "#")
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == pinned["KUBERNETES_VERSION"]


def test_shared_crds_established(cluster: TestCluster) -> None:
    for name in SHARED_CRDS:
        status = cluster.kubectl(
            "get", "crd", name, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        ).stdout
        assert status == "True", name


def test_valid_pytorchjob_passes_server_dry_run(cluster: TestCluster) -> None:
    cluster.create_namespace("crd-valid")
    res = cluster.kubectl("apply", "--dry-run=server", "-n", "crd-valid", "-f", "-", input=json.dumps(pytorchjob("ok")))
    assert "created (server dry run)" in res.stdout


def test_invalid_pytorchjob_is_rejected_naming_the_field(cluster: TestCluster) -> None:
    cluster.create_namespace("crd-invalid")
    bad = pytorchjob("bad", run_policy={"backoffLimit": "three"})  # schema says integer
    res = cluster.kubectl(
        "apply", "--dry-run=server", "-n", "crd-invalid", "-f", "-", input=json.dumps(bad), check=False
    )
    assert res.returncode != 0
    assert "spec.runPolicy.backoffLimit" in res.stderr
    assert "integer" in res.stderr


def test_cel_transition_rule_with_oldself_is_enforced(cluster: TestCluster) -> None:
    # The PyTorchJob CRD makes runPolicy.schedulingPolicy.queue immutable with
    # the CEL rule `self == oldSelf`: updates that change it must be refused.
    cluster.create_namespace("crd-cel")
    cluster.apply(pytorchjob("cel", run_policy={"schedulingPolicy": {"queue": "a"}}), namespace="crd-cel")
    res = cluster.kubectl(
        "patch", "pytorchjob", "cel", "-n", "crd-cel", "--type=merge",
        "-p", '{"spec":{"runPolicy":{"schedulingPolicy":{"queue":"b"}}}}', check=False,
    )  # fmt: skip
    assert res.returncode != 0
    assert "spec.runPolicy.schedulingPolicy.queue is immutable" in res.stderr
    # Other fields stay mutable.
    cluster.kubectl(
        "patch", "pytorchjob", "cel", "-n", "crd-cel", "--type=merge", "-p", '{"spec":{"runPolicy":{"backoffLimit":2}}}'
    )


def test_extra_crd_with_cel_rules_installs(cluster: TestCluster, tmp_path: Path) -> None:
    # install_crds() takes our own CRDs too; this one checks a cross-field rule
    # and an oldSelf ratchet (size may only grow), as our CRD may use both.
    spec_schema = {
        "type": "object",
        "properties": {
            "min": {"type": "integer"},
            "max": {"type": "integer"},
            "size": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "shrink"}]},
        },
        "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must be <= max"}],
    }
    schema = {"type": "object", "properties": {"spec": spec_schema}}
    path = write_crd(tmp_path, "test.fsdp.dev", "Widget", schema)
    assert cluster.install_crds(path) == ["widgets.test.fsdp.dev"]
    cluster.create_namespace("crd-extra")

    def widget(**spec: int) -> dict[str, Any]:
        return {"apiVersion": "test.fsdp.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}

    bad = cluster.kubectl("create", "-n", "crd-extra", "-f", "-", input=json.dumps(widget(min=3, max=1)), check=False)
    assert "min must be <= max" in bad.stderr
    cluster.apply(widget(min=1, max=3, size=2), namespace="crd-extra")
    shrink = cluster.kubectl(
        "patch", "widget", "w", "-n", "crd-extra", "--type=merge", "-p", '{"spec":{"size":1}}', check=False
    )
    assert "shrink" in shrink.stderr
    cluster.kubectl("patch", "widget", "w", "-n", "crd-extra", "--type=merge", "-p", '{"spec":{"size":5}}')


def test_rbac_is_enforced_for_serviceaccounts(cluster: TestCluster) -> None:
    kubeconfig = cluster.serviceaccount_kubeconfig("rbac", "worker")
    whoami = cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=kubeconfig)
    assert whoami.stdout == "system:serviceaccount:rbac:worker"

    denied = cluster.kubectl("get", "pods", "-n", "rbac", kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr

    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader", "namespace": "rbac"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        }
    )
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "worker-reads-pods", "namespace": "rbac"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "worker", "namespace": "rbac"}],
        }
    )
    # RBAC caches update asynchronously.
    wait_for(
        lambda: cluster.kubectl("get", "pods", "-n", "rbac", kubeconfig=kubeconfig, check=False).returncode == 0,
        15,
        "the RoleBinding to take effect",
        interval=0.2,
    )
    # The Role grants exactly what it says: still no pods elsewhere, no writes.
    assert "Forbidden" in cluster.kubectl("get", "pods", "-n", "default", kubeconfig=kubeconfig, check=False).stderr
    can_delete = cluster.kubectl("auth", "can-i", "delete", "pods", "-n", "rbac", kubeconfig=kubeconfig, check=False)
    assert can_delete.stdout.strip() == "no"


@pytest.mark.slow
def test_apiserver_restart_keeps_data_and_port(cluster: TestCluster) -> None:
    cluster.create_namespace("restart")
    cluster.kubectl("create", "configmap", "survivor", "-n", "restart", "--from-literal=k=v")
    sa_kubeconfig = cluster.serviceaccount_kubeconfig("restart", "reader")
    server = cluster.server

    cluster.stop_apiserver()
    down = cluster.kubectl("get", "ns", check=False, timeout=30)
    assert down.returncode != 0
    assert "refused" in down.stderr  # nothing listens on the port any more

    cluster.start_apiserver()
    assert cluster.server == server
    assert cluster.readyz() == "ok"
    data = cluster.kubectl("get", "configmap", "survivor", "-n", "restart", "-o", "jsonpath={.data.k}").stdout
    assert data == "v"
    # Tokens issued before the restart stay valid (same signing key, same etcd).
    whoami = cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=sa_kubeconfig)
    assert whoami.stdout == "system:serviceaccount:restart:reader"
