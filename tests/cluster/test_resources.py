"""``Resources``: objects read by kubectl's resource names give what ``kubectl get -o json`` gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.node_agent.client import KubeAPI
from fsdp_localcluster.resources import Resources

from tests.cluster.crds import write_crd


def kubectl_json(cluster: TestCluster, *args: str) -> Any:
    out = cluster.kubectl("get", *args, "-o", "json", "--ignore-not-found")
    return json.loads(out.stdout) if out.stdout.strip() else None


def test_names_resolve_as_kubectl_resolves_them(cluster: TestCluster, tmp_path: Path) -> None:
    res = Resources(KubeAPI(cluster.kubeconfig, tmp_path))
    cluster.create_namespace("res-names")
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one", "labels": {"a": "b"}}},
        namespace="res-names",
    )
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}}, namespace="res-names")
    # Plural, singular, short name, kind and <plural>.<group> all name the same collection.
    for name in ("configmaps", "configmap", "cm", "ConfigMap"):
        got = res.get(name, "one", "res-names")
        assert (
            got is not None
            and got["metadata"]["uid"] == kubectl_json(cluster, "cm", "one", "-n", "res-names")["metadata"]["uid"]
        )
    assert res.get("cm", "missing", "res-names") is None
    # A cluster-scoped kind ignores the namespace, as kubectl does.
    assert res.get("namespaces", "res-names", "res-names")["metadata"]["name"] == "res-names"

    listed = res.list("configmaps", "res-names")
    want = kubectl_json(cluster, "configmaps", "-n", "res-names")["items"]
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in listed] == [
        (i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in want
    ]
    assert [i["metadata"]["name"] for i in res.list("cm", "res-names", selector="a=b")] == ["one"]
    assert "res-names" in {i["metadata"]["namespace"] for i in res.list("configmaps")}  # all namespaces

    # The shared CRDs: a custom resource by its short name and by <plural>.<group>.
    assert res.list("pytorchjobs.kubeflow.org", "res-names") == res.list("pytorchjob", "res-names") == []

    with pytest.raises(RuntimeError, match='the server doesn\'t have a resource type "widgetz"'):
        res.get("widgetz", "w", "res-names")


def test_a_crd_installed_after_the_first_read_is_found(cluster: TestCluster, tmp_path: Path) -> None:
    res = Resources(KubeAPI(cluster.kubeconfig, tmp_path))
    assert res.list("namespaces")  # discovery read before the CRD exists
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    path = write_crd(tmp_path, "res.fsdp.dev", "Gadget", schema, short_names=("gd",))
    assert cluster.install_crds(path) == ["gadgets.res.fsdp.dev"]
    cluster.create_namespace("res-crd")
    cluster.apply({"apiVersion": "res.fsdp.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}}, namespace="res-crd")
    assert res.get("gd", "g", "res-crd")["kind"] == "Gadget"
    assert [(i["kind"], i["apiVersion"]) for i in res.list("gadgets.res.fsdp.dev", "res-crd")] == [
        ("Gadget", "res.fsdp.dev/v1")
    ]
