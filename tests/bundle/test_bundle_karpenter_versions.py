"""The Karpenter overlay against the CRDs of the oldest Karpenter it supports, and of one too old.

The newest CRDs (vendored: localcluster/fsdp_localcluster/crds/karpenter, v1.14.1) are checked with every
other overlay (test_bundle_cluster.py). Here each version gets an API server of
its own with exactly that version's CRDs (tools/versions.env pins them;
tools/fetch-karpenter-crds.sh brings them from the Go module proxy).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import karpenter_crds

from tests.bundle.manifests import kustomize_text

pytestmark = pytest.mark.cluster


def karpenter_overlay() -> str:
    return kustomize_text("overlays/karpenter").replace("${CLUSTER_NAME}", "floor-check")


def server_dry_run(cluster: TestCluster) -> tuple[int, str]:
    res = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=karpenter_overlay(), check=False
    )
    return res.returncode, res.stdout + res.stderr


@pytest.fixture(scope="module", params=["KARPENTER_MIN_VERSION", "KARPENTER_TOO_OLD_VERSION"])
def karpenter_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, TestCluster]]:
    crds = karpenter_crds(request.param)
    cluster = TestCluster(crds=[crds])
    try:
        cluster.start()
        yield request.param, cluster
    finally:
        cluster.stop()


def test_the_overlay_needs_the_documented_minimum_karpenter(karpenter_cluster: tuple[str, TestCluster]) -> None:
    variable, cluster = karpenter_cluster
    rc, out = server_dry_run(cluster)
    if variable == "KARPENTER_MIN_VERSION":
        assert rc == 0, out
        assert "nodepool.karpenter.sh/gpu serverside-applied (server dry run)" in out, out
        assert "ec2nodeclass.karpenter.k8s.aws/gpu serverside-applied (server dry run)" in out, out
    else:
        # The reserved-capacity field this bundle uses does not exist there: the floor is real.
        assert rc != 0, out
        assert "capacityReservationSelectorTerms" in out, out
