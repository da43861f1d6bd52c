"""The default backend of an install (components/default-backend-trainjob), against a real API server.

The component moves the CRD's default of spec.backend to trainjob. The API
server then fills it in when a training is created, and the CRD's trainjob
rules hold for a training that names no backend. Helm installs apply the
component's patch file with `kubectl patch`; both ways are checked here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.wait import wait_for

from tests.bundle.manifests import KUSTOMIZE, kustomize

pytestmark = pytest.mark.cluster

CRD = KUSTOMIZE / "crd" / "training.fsdp.dev_fsdptrainings.yaml"
PATCH = KUSTOMIZE / "components" / "default-backend-trainjob" / "backend-default.yaml"
CRD_NAME = "fsdptrainings.training.fsdp.dev"


def training(**spec: object) -> str:
    body = {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": "no-backend", "namespace": "default"},
        "spec": {
            "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
            "model": {"preset": "tiny"},
            "training": {"maxSteps": 10},
            **spec,
        },
    }
    return yaml.safe_dump(body)


def created(cluster: TestCluster, text: str) -> dict:
    out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=text)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def crd_cluster() -> Iterator[TestCluster]:
    """An API server with only our CRD, as generated: its cluster-wide default must not reach the shared cluster."""
    with TestCluster(crds=[CRD]) as cluster:
        yield cluster


def test_the_overlay_and_the_helm_patch_make_trainjob_the_default(crd_cluster: TestCluster) -> None:
    # As generated, the CRD defaults it to pytorchjob.
    assert created(crd_cluster, training())["spec"]["backend"] == "pytorchjob"
    (crd,) = [o for o in kustomize("overlays/trainer-v2-only") if o["metadata"]["name"] == CRD_NAME]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["backend"]["default"] == "trainjob"
    # What a Helm user runs (the chart's crds/ are not templated): the component's own patch file.
    crd_cluster.kubectl("patch", "crd", CRD_NAME, "--type=json", f"--patch-file={PATCH}")
    patched = json.loads(crd_cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    assert patched["spec"]["versions"] == crd["spec"]["versions"]
    # The API server serves the new schema a moment after the update.
    wait_for(lambda: created(crd_cluster, training())["spec"]["backend"] == "trainjob", 30, "the new default")
    # The CRD's trainjob rules hold for a training that names no backend.
    res = crd_cluster.kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        input=training(elastic={"minNodes": 1, "maxNodes": 2}),
        check=False,
    )
    assert res.returncode != 0 and "elastic needs backend: pytorchjob" in res.stderr, res.stderr
    # Naming a backend still wins.
    assert created(crd_cluster, training(backend="pytorchjob"))["spec"]["backend"] == "pytorchjob"


def test_the_patch_guards_the_default_it_replaces() -> None:
    ops = yaml.safe_load(Path(PATCH).read_text())
    assert ops[0] == {"op": "test", "path": ops[1]["path"], "value": "pytorchjob"}
