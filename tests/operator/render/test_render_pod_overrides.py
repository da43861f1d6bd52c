"""spec.pod, spec.runPolicy and resources.placement: the pod escape hatches (docs/renderer.md, "Pod settings")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fsdp_api import FSDPTraining
from fsdp_operator.render import render
from pydantic import ValidationError

Obj = dict[str, Any]


def training(pod: Obj | None = None, **extra: Any) -> FSDPTraining:
    spec: Obj = {
        "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
        "model": {"preset": "tiny"},
        "training": {"maxSteps": 10},
        "resources": {"nodes": 2, "gpusPerNode": 8, "instanceTypes": ["p5.48xlarge"]},
        **extra,
    }
    if pod is not None:
        spec["pod"] = pod
    return FSDPTraining.model_validate({"metadata": {"name": "llama", "namespace": "ml"}, "spec": spec})


def job(t: FSDPTraining) -> Obj:
    return next(o for o in render(t) if o["kind"] == "PyTorchJob")


def template(t: FSDPTraining) -> Obj:
    return job(t)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


DATA = {
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "fsx-data", "readOnly": True}}],
    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
}


def test_labels_and_annotations_reach_the_job_and_the_pods() -> None:
    t = training({"labels": {"team": "nlp"}, "annotations": {"example.com/owner": "alice"}})
    j, tpl = job(t), template(t)
    for meta in (j["metadata"], tpl["metadata"]):
        assert meta["labels"]["team"] == "nlp"
        assert meta["annotations"]["example.com/owner"] == "alice"
        assert meta["labels"]["training.fsdp.dev/job"] == "llama"
        assert meta["annotations"]["training.fsdp.dev/checkpoints"] == "ephemeral"


@pytest.mark.parametrize(
    ("field", "key", "message"),
    [
        ("labels", "app.kubernetes.io/instance", "labels must not use the operator's keys"),
        ("labels", "training.fsdp.dev/job", "labels must not use the operator's keys"),
        ("annotations", "training.fsdp.dev/checkpoints", "annotations must not use the operator's keys"),
        ("annotations", "karpenter.sh/do-not-disrupt", "annotations must not use the operator's keys"),
    ],
)
def test_reserved_keys_are_refused(field: str, key: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        training({field: {key: "x"}})


def test_extra_volumes_are_mounted_after_ours() -> None:
    pod = template(training(DATA))["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "fsx-data", "readOnly": True}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert mounts[-1] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert [m["name"] for m in mounts[:5]] == ["config", "dshm", "checkpoints", "tmp", "home"]


@pytest.mark.parametrize("path", ["/tmp", "/home", "/etc/fsdp/x", "/dev/shm/x", "/checkpoints", "/checkpoints/a"])
def test_a_colliding_mount_path_is_refused(path: str) -> None:
    pod = {**DATA, "volumeMounts": [{"name": "data", "mountPath": path}]}
    with pytest.raises(ValidationError, match="a mountPath must not be one of the pod's own mounts"):
        training(pod)


def test_a_mount_inside_home_is_allowed() -> None:
    pod = {**DATA, "volumeMounts": [{"name": "data", "mountPath": "/home/trainer/.cache/huggingface"}]}
    assert template(training(pod))["spec"]["containers"][0]["volumeMounts"][-1]["name"] == "data"


def test_placement_none_has_no_karpenter_key_anywhere() -> None:
    t = training(resources={"nodes": 2, "gpusPerNode": 8, "placement": "none", "instanceTypes": ["ml.p5.48xlarge"]})
    tpl = template(t)
    assert "karpenter.sh/" not in json.dumps(tpl)
    assert "nodeSelector" not in tpl["spec"]
    # The default placement still selects the NodePool and capacity type.
    default = template(training())
    assert default["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "gpu"
    assert default["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"


def test_placement_none_with_a_node_selector_of_its_own() -> None:
    t = training(
        {"nodeSelector": {"sagemaker.amazonaws.com/compute-type": "hyperpod"}},
        resources={"placement": "none"},
    )
    assert template(t)["spec"]["nodeSelector"] == {"sagemaker.amazonaws.com/compute-type": "hyperpod"}


def test_node_selector_tolerations_and_affinity_merge_with_ours() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}
    spread = {"labelSelector": {"matchLabels": {"team": "nlp"}}, "topologyKey": "kubernetes.io/hostname"}
    t = training(
        {
            "nodeSelector": {"example.com/pool": "a"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [zone]}]
                    }
                },
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]},
            },
        }
    )
    pod = template(t)["spec"]
    assert pod["nodeSelector"] == {
        "karpenter.sh/nodepool": "gpu",
        "karpenter.sh/capacity-type": "on-demand",
        "example.com/pool": "a",
    }
    assert [x["key"] for x in pod["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [e["key"] for e in term["matchExpressions"]] == ["node.kubernetes.io/instance-type", zone["key"]]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert (
        anti[0]["topologyKey"] == "kubernetes.io/hostname"
        and anti[0]["labelSelector"]["matchLabels"]["training.fsdp.dev/job"] == "llama"
    )
    assert anti[1] == spread


def test_node_selector_cannot_override_the_node_pool() -> None:
    with pytest.raises(ValidationError, match=r"nodeSelector must not set karpenter\.sh/nodepool"):
        training({"nodeSelector": {"karpenter.sh/nodepool": "other"}})


def _env(pod: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def test_grace_period_default_and_override_reach_torchrun() -> None:
    pod = template(training())["spec"]
    assert pod["terminationGracePeriodSeconds"] == 300
    assert _env(pod)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "285"
    pod = template(training({"terminationGracePeriodSeconds": 900, "priorityClassName": "training-high"}))["spec"]
    assert pod["terminationGracePeriodSeconds"] == 900
    assert _env(pod)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "885"
    assert pod["priorityClassName"] == "training-high"


def test_run_policy_deadlines() -> None:
    policy = job(training(runPolicy={"activeDeadlineSeconds": 86400, "ttlSecondsAfterFinished": 3600}))["spec"][
        "runPolicy"
    ]
    assert policy["activeDeadlineSeconds"] == 86400
    assert policy["ttlSecondsAfterFinished"] == 3600
    assert "activeDeadlineSeconds" not in job(training())["spec"]["runPolicy"]
