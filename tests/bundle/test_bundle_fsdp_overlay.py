"""kustomize/overlays/fsdp: the renderer's output, committed, with working kustomize knobs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml
from fsdp_localcluster.binaries import tool_path

from tests.bundle.manifests import (
    FSDP_SOURCE,
    KUSTOMIZE,
    by_ident,
    kustomize,
    load_all,
    render_training,
    run,
)
from tools import generate_manifests

OVERLAY = KUSTOMIZE / "overlays" / "fsdp"


def job(objs: list[dict]) -> dict:
    (pj,) = [o for o in objs if o["kind"] == "PyTorchJob"]
    return pj


def nnodes(pj: dict) -> int:
    args = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"]
    (flag,) = [a for a in args if a.startswith("--nnodes=")]
    return int(flag.split("=")[1])


def test_committed_files_match_the_renderer() -> None:
    problems = generate_manifests.drift(generate_manifests.render_files())
    assert not problems, "\n".join(problems) + "\nrun: python tools/generate_manifests.py"


def test_drift_is_detected(tmp_path: Path) -> None:
    """An edited generated file, or a stray one, is reported."""
    copy = tmp_path / "generated"
    shutil.copytree(OVERLAY / "generated", copy)
    pj = copy / "pytorchjob.yaml"
    pj.write_text(pj.read_text().replace("--nnodes=2", "--nnodes=3"))
    (copy / "leftover.yaml").write_text("kind: ConfigMap\n")
    problems = generate_manifests.drift(generate_manifests.render_files(), copy)
    assert len(problems) == 2
    assert any("+            - --nnodes=2" in p and "-            - --nnodes=3" in p for p in problems)
    assert any("leftover.yaml: not produced by the renderer" in p for p in problems)


def test_overlay_is_the_rendered_job_plus_its_namespace_and_volume() -> None:
    built = by_ident(kustomize("overlays/fsdp"))
    rendered = by_ident(render_training(FSDP_SOURCE))
    assert set(rendered) | {"Namespace fsdp-jobs", "PersistentVolumeClaim fsdp-jobs/llama3-1b-checkpoints"} == set(
        built
    )
    for key, obj in rendered.items():
        assert built[key] == obj, key
    # The volume the job mounts is the one the overlay creates, ReadWriteMany for every rank.
    pvc = built["PersistentVolumeClaim fsdp-jobs/llama3-1b-checkpoints"]
    pod = job(list(built.values()))["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [pvc["metadata"]["name"]]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_default_node_count_is_consistent() -> None:
    pj = job(kustomize("overlays/fsdp"))
    training = yaml.safe_load(FSDP_SOURCE.read_text())
    nodes = training["spec"]["resources"]["nodes"]
    assert pj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == nodes == nnodes(pj)


def overlay_on_top(tmp_path: Path, body: str) -> list[dict]:
    """Build a user's overlay that uses kustomize/overlays/fsdp as its base."""
    # kustomize refuses absolute paths to bases; users write relative ones anyway.
    base = os.path.relpath(OVERLAY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {base}\n{body}"
    )
    return load_all(run([tool_path("kubectl"), "kustomize", tmp_path]))


def test_knobs_namespace_image_and_nodes(tmp_path: Path) -> None:
    patch = (OVERLAY / "nodes-patch.yaml").read_text()
    patch = patch.replace("value: 2", "value: 4").replace("--nnodes=2", "--nnodes=4").replace("value: 6", "value: 12")
    (tmp_path / "nodes.yaml").write_text(patch)
    objs = overlay_on_top(
        tmp_path,
        "namespace: team-a\n"
        "images:\n  - name: ghcr.io/fsdp-k8s/trainer\n    newName: registry.example.com/ml/fsdp-trainer\n"
        "    newTag: 1.2.3\n"
        "patches:\n  - path: nodes.yaml\n    target:\n      kind: PyTorchJob\n",
    )
    # Every namespaced object moved, and the Namespace object itself was renamed.
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert namespaces == {"team-a"}
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"] == ["team-a"]
    pj = job(objs)
    (container,) = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/ml/fsdp-trainer:1.2.3"
    assert pj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4 == nnodes(pj)
    assert pj["spec"]["runPolicy"]["backoffLimit"] == 12
    # The PodMonitor still finds the pods: its selector is a subset of the pod labels.
    (pm,) = [o for o in objs if o["kind"] == "PodMonitor"]
    pod_labels = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_generator_check_mode_exit_codes(tmp_path: Path, monkeypatch) -> None:
    assert generate_manifests.main(["--check"]) == 0
    copy = tmp_path / "generated"
    shutil.copytree(OVERLAY / "generated", copy)
    (copy / "configmap.yaml").write_text("# edited by hand\n")
    monkeypatch.setattr(generate_manifests, "GENERATED", copy)
    assert generate_manifests.main(["--check"]) == 1
    assert generate_manifests.main([]) == 0
    assert generate_manifests.main(["--check"]) == 0
    assert (copy / "configmap.yaml").read_text() == (OVERLAY / "generated" / "configmap.yaml").read_text()
