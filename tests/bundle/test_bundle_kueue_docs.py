"""docs/kueue.md's Kueue objects and its FSDPTraining, server-dry-run against Kueue's own CRDs and ours.

The queue objects a platform engineer copies from the page must be what
Kueue v0.17.0's API server schema accepts (its CRDs from the pinned module),
and the training must be accepted by ours and render a job Kueue will queue.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fsdp_api import FSDPTraining
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import ensure_tools, kueue_source
from fsdp_operator.render import render

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "kueue.md"
OUR_CRD = REPO / "kustomize" / "crd" / "training.fsdp.dev_fsdptrainings.yaml"


def yaml_blocks() -> list[list[dict]]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return [[d for d in yaml.safe_load_all(b) if d] for b in blocks]


@pytest.fixture(scope="module")
def kueue_cluster() -> Iterator[TestCluster]:
    ensure_tools(["kueue"])
    cluster = TestCluster(crds=[kueue_source() / "config" / "components" / "crd" / "bases", OUR_CRD])
    try:
        cluster.start()
        cluster.create_namespace("team-a")  # the page's namespace
        yield cluster
    finally:
        cluster.stop()


def test_the_pages_queue_objects_are_accepted_by_kueues_schema(kueue_cluster: TestCluster) -> None:
    queue_objects = [d for block in yaml_blocks() for d in block if d["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert {d["kind"] for d in queue_objects} == {
        "Topology",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "WorkloadPriorityClass",
    }
    text = yaml.safe_dump_all(queue_objects)
    res = kueue_cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=text, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def trainings() -> list[dict]:
    return [d for block in yaml_blocks() for d in block if d["kind"] == "FSDPTraining"]


def accepted_job(cluster: TestCluster, doc: dict) -> dict:
    """The training's PyTorchJob, once the API server (our CRD) has accepted the training."""
    res = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return next(o for o in render(FSDPTraining.model_validate(doc)) if o["kind"] == "PyTorchJob")


def test_the_pages_training_is_accepted_and_renders_a_queued_job(kueue_cluster: TestCluster) -> None:
    doc, _ = trainings()
    job = accepted_job(kueue_cluster, doc)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"
    assert "suspend" not in job["spec"]["runPolicy"]
    # The page's ClusterQueue covers every resource the rendered pods request (else Kueue never admits it).
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    requested = set(pod["resources"]["requests"])
    (cq,) = [d for block in yaml_blocks() for d in block if d["kind"] == "ClusterQueue"]
    covered = {r for g in cq["spec"]["resourceGroups"] for r in g["coveredResources"]}
    assert requested <= covered, requested - covered


def test_the_pages_topology_training_asks_for_a_level_of_the_pages_topology(kueue_cluster: TestCluster) -> None:
    _, doc = trainings()
    job = accepted_job(kueue_cluster, doc)
    annotations = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"]
    level = annotations["kueue.x-k8s.io/podset-required-topology"]
    (topology,) = [d for block in yaml_blocks() for d in block if d["kind"] == "Topology"]
    assert level in [lv["nodeLabel"] for lv in topology["spec"]["levels"]]
    # Without instance types Kueue could count two pods onto one node: the API server refuses it.
    del doc["spec"]["resources"]["instanceTypes"]
    res = kueue_cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False
    )
    assert res.returncode != 0 and "scheduling.topology needs resources.instanceTypes" in res.stderr, res.stderr
