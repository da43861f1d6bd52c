"""The chart README's CRD upgrade, run as written against a real kube-apiserver and the real helm and kubectl.

Helm creates the CRDs of ``crds/`` on install under its own field manager and never upgrades them;
the README says a plain ``kubectl apply --server-side`` of a newer CRD then conflicts on
``.spec.versions``, and gives the forced apply that keeps an install's ``trainjob`` default.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import tool_path

from tests.bundle.manifests import CHART, KUSTOMIZE

pytestmark = pytest.mark.cluster

CRD_NAME = "fsdptrainings.training.fsdp.dev"
CRD_FILE = CHART / "crds" / "training.fsdp.dev_fsdptrainings.yaml"
TRAINJOB_DEFAULT = KUSTOMIZE / "components" / "default-backend-trainjob" / "backend-default.yaml"
# A line of the CRD's schema that a newer chart would change (any edit of .spec.versions does).
DESCRIPTION = "description: FSDPTraining runs a PyTorch FSDP2 training job"


@pytest.fixture(scope="module")
def helm_cluster() -> Iterator[TestCluster]:
    """An API server of its own: Helm installs the CRDs cluster-wide, with its field manager."""
    with TestCluster(crds=[]) as cluster:
        yield cluster


def backend_default(cluster: TestCluster) -> str:
    crd = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["backend"]["default"]


def sh(cluster: TestCluster, script: str) -> subprocess.CompletedProcess[str]:
    """The README's commands as a shell runs them, with this cluster's kubeconfig and the built kubectl."""
    env = {"KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{tool_path('kubectl').parent}:/usr/bin:/bin"}
    env["KUBECACHEDIR"] = str(cluster.workdir / "kubectl-cache")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)


def test_the_documented_crd_upgrade_conflicts_plainly_and_forced_keeps_the_installs_default(
    helm_cluster: TestCluster, tmp_path: Path
) -> None:
    helm = [str(tool_path("helm")), f"--kubeconfig={helm_cluster.kubeconfig}"]
    install = [*helm, "install", "fsdp-operator", str(CHART), "--namespace=fsdp-system", "--create-namespace"]
    subprocess.run(install, check=True, capture_output=True, text=True, timeout=120)
    managers = json.loads(helm_cluster.kubectl("get", "crd", CRD_NAME, "-o", "json", "--show-managed-fields").stdout)[
        "metadata"
    ]["managedFields"]
    assert [m["manager"] for m in managers if "f:spec" in m.get("fieldsV1", {})] == ["helm"]
    text = CRD_FILE.read_text()
    assert text.count(DESCRIPTION) == 1
    newer = tmp_path / "crds" / CRD_FILE.name
    newer.parent.mkdir()
    newer.write_text(text.replace(DESCRIPTION, DESCRIPTION + " (upgraded.)"))

    # Untouched since the install: the conflict is with Helm.
    plain = sh(helm_cluster, f"kubectl apply --server-side -f {newer}")
    assert plain.returncode != 0
    assert 'conflict with "helm" using apiextensions.k8s.io/v1: .spec.versions' in plain.stderr, plain.stderr

    # The install defaults to trainjob, the way docs/backends.md sets it.
    helm_cluster.kubectl("patch", "crd", CRD_NAME, "--type=json", f"--patch-file={TRAINJOB_DEFAULT}")
    assert backend_default(helm_cluster) == "trainjob"

    # Patched since: the conflict is with the patch, and the default stays.
    plain = sh(helm_cluster, f"kubectl apply --server-side -f {newer}")
    assert plain.returncode != 0
    assert 'conflict with "kubectl-patch" using apiextensions.k8s.io/v1: .spec.versions' in plain.stderr, plain.stderr
    assert backend_default(helm_cluster) == "trainjob"

    documented = (
        f"kubectl patch --local -f {newer} --type=json --patch-file {TRAINJOB_DEFAULT} -o yaml"
        " | kubectl apply --server-side --force-conflicts -f -"
    )
    forced = sh(helm_cluster, documented)
    assert forced.returncode == 0, forced.stderr
    assert backend_default(helm_cluster) == "trainjob"
    assert "(upgraded.)" in helm_cluster.kubectl("get", "crd", CRD_NAME, "-o", "yaml").stdout
    # kubectl owns .spec.versions now: the next upgrade the same way conflicts with nobody, even unforced.
    again = sh(helm_cluster, documented.replace(" --force-conflicts", ""))
    assert again.returncode == 0, again.stderr

    # The patch's test operation refuses a file whose default is no longer pytorchjob, and nothing is applied.
    changed = tmp_path / "changed.yaml"
    changed.write_text(text.replace("default: pytorchjob", "default: jobset", 1))
    refused = sh(helm_cluster, documented.replace(str(newer), str(changed)))
    assert refused.returncode != 0 and "test" in refused.stderr.lower(), refused.stderr
    assert "(upgraded.)" in helm_cluster.kubectl("get", "crd", CRD_NAME, "-o", "yaml").stdout

    # What the README warns of: the chart's file forced as it is resets the install's default.
    assert sh(helm_cluster, f"kubectl apply --server-side --force-conflicts -f {newer}").returncode == 0
    assert backend_default(helm_cluster) == "pytorchjob"
