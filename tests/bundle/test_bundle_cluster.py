"""Every overlay, the chart and the renderer's output, validated by a real kube-apiserver.

``kubectl apply --dry-run=server`` runs the full admission chain (OpenAPI
schemas of the real third-party CRDs, CEL rules, defaulting) without storing
anything. Our CRDs are installed for real first, because a dry-run CRD does
not make its custom resources valid.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import tool_path

from tests.bundle.manifests import (
    CHART,
    KUSTOMIZE,
    OVERLAYS,
    example_files,
    helm_args,
    kustomize,
    kustomize_text,
    load_all,
    render_training,
    run,
)

pytestmark = pytest.mark.cluster

CHART_VALUES = {
    "monitoring.enabled": "true",
    "serviceMonitor.enabled": "true",
    "karpenter.enabled": "true",
    "karpenter.clusterName": "dry-run",
    "trainJobRuntime.enabled": "true",
}


@pytest.fixture(scope="module")
def bundle_cluster(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> TestCluster:
    """The shared cluster with our CRDs installed and every namespace the manifests use created."""
    crds = tmp_path_factory.mktemp("crds") / "crds.yaml"
    crds.write_text(kustomize_text("crd"))
    cluster.install_crds(crds)
    namespaces = {"fsdp-system", "monitoring"}
    for objs in [kustomize(o) for o in OVERLAYS] + [render_training(p) for p in example_files()]:
        namespaces |= {o["metadata"]["namespace"] for o in objs if o["metadata"].get("namespace")}
    for ns in sorted(namespaces):
        cluster.create_namespace(ns)
    return cluster


def dry_run(cluster: TestCluster, manifests: str) -> str:
    res = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=bundle-test",
        # The cluster is shared: another test may have applied the same objects (the operator's
        # RBAC) under its own field manager. What is checked is that the server accepts them.
        "--force-conflicts",
        "-f",
        "-",
        input=manifests,
        check=False,
    )
    assert res.returncode == 0, f"the API server rejected the manifests:\n{res.stderr}"
    return res.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_is_accepted(bundle_cluster: TestCluster, overlay: str) -> None:
    text = kustomize_text(overlay)
    out = dry_run(bundle_cluster, text)
    # One "serverside-applied (server dry run)" line per object: none was skipped.
    assert out.count("(server dry run)") == len(load_all(text)), out


def test_helm_template_is_accepted(bundle_cluster: TestCluster) -> None:
    text = run(
        [
            tool_path("helm"),
            "template",
            "fsdp-operator",
            CHART,
            "--include-crds",
            *helm_args(CHART_VALUES, "fsdp-system"),
        ]
    )
    out = dry_run(bundle_cluster, text)
    assert out.count("(server dry run)") == len(load_all(text))
    for kind in (
        "deployment.apps",
        "prometheusrule.monitoring.coreos.com",
        "nodepool.karpenter.sh",
        "ec2nodeclass.karpenter.k8s.aws",
        "clustertrainingruntime.trainer.kubeflow.org",
        "customresourcedefinition.apiextensions.k8s.io",
    ):
        assert kind in out, kind


def test_helm_install_dry_run_against_the_server(bundle_cluster: TestCluster) -> None:
    """`helm install --dry-run=server` (server-side lookups and validation) succeeds and prints the NOTES.

    The cluster is shared, and the operator tests (tests/operator) install the kustomize
    bundle into it, in any order when the suite runs on several workers. Helm refuses to
    adopt objects another installer made; a dry run changes nothing, so it is told to
    take them over and the rest of the check is the same whichever test ran first.
    """
    namespace = "fsdp-system"
    res = subprocess.run(
        [
            str(tool_path("helm")),
            "install",
            "fsdp-operator",
            str(CHART),
            "--dry-run=server",
            "--take-ownership",
            f"--kubeconfig={bundle_cluster.kubeconfig}",
            # The served namespace exists already (the fixture made it): Helm would refuse to adopt it.
            *helm_args({**CHART_VALUES, "createWatchNamespaces": "false"}, namespace),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    notes = res.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {namespace} get deploy fsdp-operator" in notes
    assert "Grafana" in notes and "installed by this release" in notes


@pytest.mark.parametrize("example", example_files(), ids=lambda p: p.name)
def test_rendered_examples_are_accepted(bundle_cluster: TestCluster, example: Path) -> None:
    import yaml

    objs = render_training(example)
    out = dry_run(bundle_cluster, yaml.safe_dump_all(objs))
    assert out.count("(server dry run)") == len(objs)


def test_a_broken_manifest_is_rejected(bundle_cluster: TestCluster) -> None:
    """The dry-run really validates: a NodePool with an invalid consolidation policy fails."""
    text = kustomize_text("overlays/karpenter").replace("consolidationPolicy: WhenEmpty", "consolidationPolicy: Never")
    res = bundle_cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=text, check=False)
    assert res.returncode != 0
    assert "consolidationPolicy" in res.stderr and "Unsupported value" in res.stderr


def test_overlays_directory_is_complete() -> None:
    """Every kustomization under kustomize/overlays is validated above."""
    found = {str(p.parent.relative_to(KUSTOMIZE)) for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml")}
    assert found <= set(OVERLAYS), found - set(OVERLAYS)
