"""kustomize/overlays/karpenter: the GPU capacity fits what the renderer asks of it."""

from __future__ import annotations

import email
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.spec import ResourcesSpec

from tests.bundle.manifests import example_files, kustomize, render_training

PLACEHOLDER = "${CLUSTER_NAME}"


def objects() -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in kustomize("overlays/karpenter")}


def requirement(nodepool: dict[str, Any], key: str) -> dict[str, Any]:
    (req,) = [r for r in nodepool["spec"]["template"]["spec"]["requirements"] if r["key"] == key]
    return req


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' matching rule (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def rendered_gpu_pods() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template metadata, pod spec) of every rendered example that asks for GPUs."""
    out = []
    for path in example_files():
        for obj in render_training(path):
            if obj["kind"] != "PyTorchJob":
                continue
            for replica in obj["spec"]["pytorchReplicaSpecs"].values():
                spec = replica["template"]["spec"]
                limits = spec["containers"][0]["resources"].get("limits", {})
                if "nvidia.com/gpu" in limits:
                    out.append((replica["template"]["metadata"], spec))
    assert out, "no GPU example to check the NodePool against"
    return out


def test_gpu_pods_land_on_this_nodepool() -> None:
    nodepool = objects()["NodePool"]
    taints = nodepool["spec"]["template"]["spec"]["taints"]
    capacity = set(requirement(nodepool, "karpenter.sh/capacity-type")["values"])
    for meta, pod in rendered_gpu_pods():
        selector = pod["nodeSelector"]
        # Karpenter labels its nodes with their NodePool and capacity type itself.
        assert selector["karpenter.sh/nodepool"] == nodepool["metadata"]["name"]
        assert selector["karpenter.sh/capacity-type"] in capacity
        for taint in taints:
            assert any(tolerates(t, taint) for t in pod.get("tolerations", [])), f"{taint} is not tolerated"
        # Neither consolidation nor drift may move a rank of a running job.
        assert meta["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        families = set(requirement(nodepool, "karpenter.k8s.aws/instance-family")["values"])
        for term in (
            pod.get("affinity", {})
            .get("nodeAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms", [])
        ):
            for expr in term["matchExpressions"]:
                if expr["key"] == "node.kubernetes.io/instance-type":
                    for itype in expr["values"]:
                        assert itype.split(".")[0] in families, f"{itype} is outside the NodePool's families"


# The NVIDIA device plugin chart's defaults (NVIDIA/k8s-device-plugin,
# deployments/helm/nvidia-device-plugin/values.yaml): its DaemonSet requires one
# of these node labels and tolerates these taints.
DEVICE_PLUGIN_NODE_TERMS = [
    {"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]},
    {"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]},
    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
]
DEVICE_PLUGIN_TOLERATIONS = [
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]
QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart-eks.md"


def helm_set(text: str, variable: str) -> dict[str, str]:
    """The ``--set`` pairs of a shell variable the quickstart defines (``NAME='k=v,k=v'``)."""
    (value,) = re.findall(rf"^{variable}='([^']*)'$", text, re.MULTILINE)
    pairs = [pair.split("=", 1) for pair in re.split(r"(?<!\\),", value)]
    return {k.replace("\\.", "."): v for k, v in pairs}


def test_the_device_plugins_run_on_the_gpu_nodes() -> None:
    """Without the NVIDIA plugin on a node, its GPUs are never advertised and every GPU pod stays Pending."""
    nodepool = objects()["NodePool"]
    labels = nodepool["spec"]["template"]["metadata"]["labels"]
    taints = nodepool["spec"]["template"]["spec"]["taints"]
    assert any(labels.get(t["key"]) in t["values"] for t in DEVICE_PLUGIN_NODE_TERMS), labels
    for taint in taints:
        assert any(tolerates(t, taint) for t in DEVICE_PLUGIN_TOLERATIONS), taint
    doc = QUICKSTART.read_text()
    # The NVIDIA plugin keeps its own tolerations: a --set tolerations[0] would replace the list.
    (nvidia,) = [line for line in doc.splitlines() if line.startswith("helm upgrade --install nvidia-device-plugin")]
    assert "--set" not in nvidia, nvidia
    # The EFA plugin and dcgm-exporter get the quickstart's toleration; dcgm-exporter also the node selector.
    toleration = helm_set(doc, "GPU_TOLERATION")
    given = {k.split(".", 1)[1]: v for k, v in toleration.items()}
    for taint in taints:
        assert tolerates(given, taint), (given, taint)
    selector = helm_set(doc, "GPU_NODES")
    assert {k.removeprefix("nodeSelector."): v for k, v in selector.items()}.items() <= labels.items()
    assert '--set-string "$GPU_NODES"' in doc  # typed: test_bundle_quickstart.py


# The AL2023 AMI's base runtime spec (awslabs/amazon-eks-ami,
# nodeadm/internal/containerd/base-runtime-spec.json) sets only this rlimit.
AMI_NOFILE = {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}


def node_config(nodeclass: dict[str, Any]) -> dict[str, Any]:
    """The NodeConfig in the EC2NodeClass's MIME user data (what nodeadm reads)."""
    message = email.message_from_string(nodeclass["spec"]["userData"])
    assert message.is_multipart()
    (part,) = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    config = yaml.safe_load(part.get_payload())
    assert (config["apiVersion"], config["kind"]) == ("node.eks.aws/v1alpha1", "NodeConfig")
    return config


def test_the_nodes_let_efa_lock_memory() -> None:
    """A non-root trainer gets the node's RLIMIT_MEMLOCK: the AMI's default would make libfabric fail with -12."""
    config = node_config(objects()["EC2NodeClass"])
    rlimits = {r["type"]: r for r in config["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]}
    # nodeadm's merge replaces the list: the AMI's NOFILE must be repeated, unchanged.
    assert rlimits["RLIMIT_NOFILE"] == AMI_NOFILE
    memlock = rlimits["RLIMIT_MEMLOCK"]
    assert memlock["soft"] == memlock["hard"] >= 1 << 50
    # The merge round-trips numbers through float64: the value must survive it and fit the spec's uint64.
    assert int(float(memlock["hard"])) == memlock["hard"] <= (1 << 64) - 1


def test_the_default_pool_name_and_capacity_types_match_the_api() -> None:
    nodepool = objects()["NodePool"]
    assert nodepool["metadata"]["name"] == ResourcesSpec.model_fields["node_pool"].default
    api_types = set(typing.get_args(ResourcesSpec.model_fields["capacity_type"].annotation))
    assert (
        set(requirement(nodepool, "karpenter.sh/capacity-type")["values"])
        == api_types
        == {
            "on-demand",
            "spot",
            "reserved",
        }
    )


def test_only_gpu_instance_families() -> None:
    nodepool = objects()["NodePool"]
    families = requirement(nodepool, "karpenter.k8s.aws/instance-family")["values"]
    assert families and all(re.fullmatch(r"[gp]\d+[a-z0-9-]*", f) for f in families), families
    assert requirement(nodepool, "karpenter.k8s.aws/instance-gpu-count") == {
        "key": "karpenter.k8s.aws/instance-gpu-count",
        "operator": "Gt",
        "values": ["0"],
    }
    assert nodepool["spec"]["template"]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    ]
    assert int(nodepool["spec"]["limits"]["nvidia.com/gpu"]) > 0


def test_disruption_never_touches_a_busy_node() -> None:
    nodepool = objects()["NodePool"]
    disruption = nodepool["spec"]["disruption"]
    assert disruption["consolidationPolicy"] == "WhenEmpty"
    budgets = {tuple(b.get("reasons", ["*"])): b["nodes"] for b in disruption["budgets"]}
    assert budgets[("Underutilized",)] == "0"
    assert budgets[("Drifted",)] == "1"
    # Expiry in Karpenter v1 ignores do-not-disrupt after the grace period: off for GPU nodes.
    assert nodepool["spec"]["template"]["spec"]["expireAfter"] == "Never"


def test_nodeclass_is_wired_and_has_placeholders_to_patch() -> None:
    objs = objects()
    nodepool, nodeclass = objs["NodePool"], objs["EC2NodeClass"]
    ref = nodepool["spec"]["template"]["spec"]["nodeClassRef"]
    assert ref == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": nodeclass["metadata"]["name"]}
    spec = nodeclass["spec"]
    assert PLACEHOLDER in spec["role"]
    for terms in ("subnetSelectorTerms", "securityGroupSelectorTerms", "capacityReservationSelectorTerms"):
        assert spec[terms] == [{"tags": {"karpenter.sh/discovery": PLACEHOLDER}}], terms
    # A pinned AMI release, not @latest.
    (ami,) = spec["amiSelectorTerms"]
    assert re.fullmatch(r"al2023@v\d{8}", ami["alias"]), ami
    (root,) = [b for b in spec["blockDeviceMappings"] if b.get("rootVolume")]
    size = int(root["ebs"]["volumeSize"].removesuffix("Gi"))
    assert size >= 200 and root["ebs"]["volumeType"] == "gp3" and root["ebs"]["encrypted"] is True
    assert spec["metadataOptions"]["httpTokens"] == "required"
