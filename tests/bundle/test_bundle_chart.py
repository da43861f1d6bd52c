"""The Helm chart: lint, CRDs, and the same objects as the kustomize installs it mirrors."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import yaml
from fsdp_localcluster.binaries import tool_path
from fsdp_operator.crd import crd
from fsdp_operator.render import cluster_training_runtime

from tests.bundle.manifests import (
    CHART,
    DASHBOARD,
    by_ident,
    helm_template,
    kustomize,
    kustomize_text,
    load_all,
    strip_helm,
)

NAMESPACE = "fsdp-system"


def diff(helm: dict[str, Any], kust: dict[str, Any]) -> str:
    """Readable difference of two objects for an assertion message."""
    return (
        f"helm:\n{yaml.safe_dump(helm, sort_keys=True)}\nkustomize:\n{yaml.safe_dump(kust, sort_keys=True)}"
        if helm != kust
        else ""
    )


def assert_same_objects(helm: list[dict], kust: list[dict]) -> None:
    h, k = by_ident([strip_helm(o) for o in helm]), by_ident([strip_helm(o) for o in kust])
    assert sorted(h) == sorted(k)
    for key in k:
        assert h[key] == k[key], f"{key} differs\n{diff(h[key], k[key])}"


def test_helm_lint() -> None:
    res = subprocess.run([str(tool_path("helm")), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout


def test_crds_are_the_generated_ones() -> None:
    crds = {o["metadata"]["name"]: o for p in sorted((CHART / "crds").iterdir()) for o in load_all(p.read_text())}
    assert crds["fsdptrainings.training.fsdp.dev"] == crd()
    # The chart installs exactly the CRDs kustomize/crd installs.
    kust = {o["metadata"]["name"] for o in kustomize("../kustomize/crd") if o["kind"] == "CustomResourceDefinition"}
    assert set(crds) == kust


def test_default_values_mirror_kustomize_default() -> None:
    """helm template (defaults) == kubectl kustomize kustomize/default, Helm bookkeeping aside.

    The one difference is the Namespace: Helm creates the release namespace
    itself (--create-namespace), so the chart renders it only with
    createNamespace=true, checked below.
    """
    kust = [o for o in kustomize("default") if o["kind"] != "Namespace"]
    helm = [o for o in helm_template(namespace=NAMESPACE, include_crds=True) if o["kind"] != "Namespace"]
    assert_same_objects(helm, kust)


def test_create_namespace_renders_kustomize_s_namespaces() -> None:
    kust = {o["metadata"]["name"]: o for o in kustomize("default") if o["kind"] == "Namespace"}
    assert set(kust) == {NAMESPACE, "fsdp-training"}  # the operator's, and the one it serves
    helm = {
        o["metadata"]["name"]: o
        for o in helm_template({"createNamespace": "true"}, namespace=NAMESPACE)
        if o["kind"] == "Namespace"
    }
    assert strip_helm(helm[NAMESPACE]) == strip_helm(kust[NAMESPACE])
    assert set(helm) == set(kust)
    # The served namespace without Helm's --create-namespace: createWatchNamespaces (on by default).
    plain = [o["metadata"]["name"] for o in helm_template(namespace=NAMESPACE) if o["kind"] == "Namespace"]
    assert plain == ["fsdp-training"]
    off = helm_template({"createWatchNamespaces": "false"}, namespace=NAMESPACE)
    assert [o for o in off if o["kind"] == "Namespace"] == []


def test_cluster_wide_is_an_opt_in_that_mirrors_the_clusterwide_overlay() -> None:
    kust = [o for o in kustomize("overlays/clusterwide") if o["kind"] != "Namespace"]
    helm = helm_template({"clusterWide": "true", "watchNamespaces": "null"}, namespace=NAMESPACE, include_crds=True)
    assert_same_objects([o for o in helm if o["kind"] != "Namespace"], kust)
    kinds = {o["kind"] for o in kust}
    assert "ClusterRoleBinding" in kinds and "RoleBinding" not in kinds
    assert "clusterWide=true serves every namespace: set watchNamespaces to []" in template_error("clusterWide=true")
    assert "watchNamespaces is empty: list the namespaces to serve" in template_error("watchNamespaces=null")


def test_full_install_mirrors_operator_with_monitoring() -> None:
    kust = [o for o in kustomize("overlays/operator-with-monitoring") if o["kind"] != "Namespace"]
    helm = helm_template(
        {"serviceMonitor.enabled": "true", "monitoring.enabled": "true"}, namespace=NAMESPACE, include_crds=True
    )
    assert_same_objects([o for o in helm if o["kind"] != "Namespace"], kust)


def test_karpenter_mirrors_the_kustomize_overlay() -> None:
    overlay = kustomize_text("overlays/karpenter").replace("${CLUSTER_NAME}", "prod-eks")
    helm = helm_template({"karpenter.enabled": "true", "karpenter.clusterName": "prod-eks"}, namespace=NAMESPACE)
    karpenter = [o for o in helm if o["apiVersion"].startswith("karpenter")]
    assert_same_objects(karpenter, load_all(overlay))
    assert "${CLUSTER_NAME}" not in yaml.safe_dump(karpenter)


def test_trainjob_runtime_mirrors_the_kustomize_overlay_and_the_renderer() -> None:
    """trainJobRuntime.enabled adds exactly what overlays/trainjob adds to default: the renderer's runtime."""
    kust = [o for o in kustomize("overlays/trainjob") if o["kind"] != "Namespace"]
    default = {(o["kind"], o["metadata"]["name"]) for o in kustomize("default")}
    (added,) = [o for o in kust if (o["kind"], o["metadata"]["name"]) not in default]
    assert added == cluster_training_runtime()
    helm = helm_template({"trainJobRuntime.enabled": "true"}, namespace=NAMESPACE)
    (runtime,) = [o for o in helm if o["kind"] == added["kind"]]
    assert_same_objects([runtime], [added])
    assert not [o for o in helm_template({}, namespace=NAMESPACE) if o["kind"] == added["kind"]]


def test_karpenter_overrides_merge_over_the_canonical_spec() -> None:
    objs = helm_template(
        {
            "karpenter.enabled": "true",
            "karpenter.clusterName": "c1",
            "karpenter.nodePool.limits.nvidia\\.com/gpu": "128",
            "karpenter.ec2NodeClass.role": "CustomNodeRole",
        }
    )
    kinds = {o["kind"]: o for o in objs}
    assert kinds["NodePool"]["spec"]["limits"]["nvidia.com/gpu"] == 128
    assert kinds["NodePool"]["spec"]["limits"]["cpu"] == "1536"  # the rest of the map is kept
    assert kinds["NodePool"]["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert kinds["EC2NodeClass"]["spec"]["role"] == "CustomNodeRole"
    assert kinds["EC2NodeClass"]["spec"]["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "c1"}}]


def template_error(*sets: str) -> str:
    args = [str(tool_path("helm")), "template", "x", str(CHART)]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True)
    assert res.returncode != 0, f"helm template {sets} should have failed"
    return res.stderr


def test_karpenter_needs_a_cluster_name() -> None:
    assert "karpenter.clusterName is required" in template_error("karpenter.enabled=true")


def test_values_schema_rejects_typos_and_wrong_types() -> None:
    assert "additional properties 'watchNamspaces' not allowed" in template_error("watchNamspaces[0]=a")
    err = template_error("priority=high")
    assert "priority" in err and "integer" in err
    err = template_error("image.pullPolicy=Sometimes")
    assert "pullPolicy" in err
    assert "/image/tag" in template_error("image.tag=latest")


def test_schema_documents_every_default_value() -> None:
    """Every key of values.yaml is declared in values.schema.json (which forbids unknown keys)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v: Any, s: dict[str, Any], path: str) -> None:
        if isinstance(v, dict) and s.get("type") == "object" and "properties" in s:
            for key, sub in v.items():
                assert key in s["properties"], f"{path}{key} is not in values.schema.json"
                walk(sub, s["properties"][key], f"{path}{key}.")

    walk(values, schema, "")


def test_watch_namespaces_binds_the_role_per_namespace() -> None:
    objs = helm_template({"watchNamespaces[0]": "team-a", "watchNamespaces[1]": "team-b"}, namespace=NAMESPACE)
    kinds = [o["kind"] for o in objs]
    assert "ClusterRoleBinding" not in kinds
    bindings = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "RoleBinding"}
    assert set(bindings) == {"team-a", "team-b"}
    for b in bindings.values():
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fsdp-operator"}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "fsdp-operator", "namespace": NAMESPACE}]
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args


def test_release_name_scopes_cluster_wide_names() -> None:
    objs = helm_template(release="ml")
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("ClusterRole", "ml-fsdp-operator") in names and ("Deployment", "ml-fsdp-operator") in names


def test_dashboard_configmap_carries_the_one_json_file() -> None:
    objs = helm_template({"monitoring.enabled": "true", "monitoring.dashboard.namespace": "monitoring"})
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["fsdp-training.json"] == DASHBOARD.read_text()


def test_shared_files_are_links_into_kustomize() -> None:
    """One copy in the repo: the chart's files/ and crds/ are symlinks to the kustomize sources."""
    for path in [*(CHART / "files").rglob("*"), *(CHART / "crds").iterdir()]:
        if path.is_file():
            assert path.is_symlink(), f"{path} is a copy; link it to the kustomize file instead"
            assert "kustomize" in os.readlink(path), path


def test_packaged_chart_carries_the_linked_files(tmp_path) -> None:
    """`helm package` resolves the symlinks: the .tgz renders the same objects on its own."""
    helm = str(tool_path("helm"))
    subprocess.run([helm, "package", str(CHART), "-d", str(tmp_path)], check=True, capture_output=True)
    (tgz,) = tmp_path.glob("fsdp-operator-*.tgz")
    sets = ["--set", "monitoring.enabled=true", "--set", "karpenter.enabled=true", "--set", "karpenter.clusterName=c"]
    from_dir = helm_template({"monitoring.enabled": "true", "karpenter.enabled": "true", "karpenter.clusterName": "c"})
    res = subprocess.run([helm, "template", "fsdp-operator", str(tgz), *sets], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert load_all(res.stdout) == from_dir
