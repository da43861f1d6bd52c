"""The EKS quickstart's own commands, run as written (up to the cluster) with the real kubectl, helm and envsubst.

What goes to ``kubectl apply`` is produced by the quickstart's pipeline and
read here instead; the Helm flags reach a stand-in chart through the real
``helm template``, so Helm types each value as it would on the cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from fsdp_localcluster.binaries import tool_path

from tests.bundle.manifests import REPO_ROOT, load_all

QUICKSTART = REPO_ROOT / "docs" / "quickstart-eks.md"
OUR_IMAGES = "ghcr.io/fsdp-k8s/"
# What the quickstart's earlier steps export (step 0 and the volume step), with stand-in values.
USER_ENV = {
    "TRAINER_IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/fsdp-k8s/trainer:0.1.0",
    "CLAIM_NAME": "llama3-1b-checkpoints",
    "CLUSTER_NAME": "my-cluster",
    "FSX_SUBNET_ID": "subnet-0123",
    "FSX_SECURITY_GROUP_ID": "sg-0123",
}
# A pipeline into `kubectl [-n NS] apply -f -`: what it feeds kubectl is the manifest a user applies.
APPLY = re.compile(r"^(?P<producer>.+?)\|\s*kubectl(?:\s+-n\s+\S+)?\s+apply\s+-f\s+-\s*$")


def shell_commands(page: Path) -> list[str]:
    """Every command of the page's ``sh`` blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
        for command in re.sub(r"\\\n\s*", " ", block).splitlines():
            if command.strip() and not command.lstrip().startswith("#"):
                commands.append(command.strip())
    return commands


def _bash(script: str, env: dict[str, str] | None = None) -> str:
    path = os.pathsep.join([str(tool_path("kubectl").parent), str(tool_path("helm").parent), os.environ["PATH"]])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {}), "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{script}\nexited {done.returncode}: {done.stderr}"
    return done.stdout


def _images(objects: list[dict]) -> list[str]:
    text = yaml.safe_dump(objects)
    return re.findall(r"image: (\S+)", text)


def test_every_manifest_the_quickstart_applies_runs_your_images_not_ours() -> None:
    pipelines = [m.group("producer") for c in shell_commands(QUICKSTART) if (m := APPLY.match(c))]
    checked = {}
    for producer in pipelines:
        objects = load_all(_bash(producer, USER_ENV))
        assert objects, f"{producer!r} produces no object"
        images = _images(objects)
        ours = [i for i in images if i.startswith(OUR_IMAGES)]
        assert not ours, f"the quickstart applies {ours} (an image you never pushed) with: {producer}"
        checked[producer] = images
    # The pipelines that start trainer containers, each with the user's image.
    with_trainer = [p for p, images in checked.items() if USER_ENV["TRAINER_IMAGE"] in images]
    assert any("checkpoint-volume-owner" in p for p in with_trainer), checked
    assert any("overlays/fsdp" in p for p in with_trainer), checked
    assert any("nccl-allreduce-smoke" in p for p in with_trainer), checked


def _dcgm_install() -> tuple[str, str]:
    """The quickstart's variable assignments and its dcgm-exporter install command."""
    commands = shell_commands(QUICKSTART)
    variables = "\n".join(c for c in commands if re.match(r"^GPU_\w+=", c))
    install = [c for c in commands if c.startswith("helm upgrade --install dcgm-exporter ")]
    assert variables and len(install) == 1, "the dcgm-exporter install is gone from the quickstart"
    return variables, install[0]


def _stand_in_chart(root: Path) -> Path:
    """A chart that renders its values where dcgm-exporter's DaemonSet puts them (nodeSelector, tolerations)."""
    chart = root / "dcgm-exporter"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: dcgm-exporter\nversion: 0.0.1\n")
    (chart / "values.yaml").write_text("nodeSelector: {}\ntolerations: []\narguments: []\n")
    (chart / "templates" / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: dcgm-exporter}\nspec:\n"
        "  nodeSelector: {{ toJson .Values.nodeSelector }}\n"
        "  tolerations: {{ toJson .Values.tolerations }}\n"
        "  containers:\n  - name: exporter\n    image: nvcr.io/nvidia/k8s/dcgm-exporter\n"
        "    args: {{ toJson .Values.arguments }}\n"
    )
    return chart


def test_the_dcgm_exporter_flags_give_kubernetes_a_string_node_selector(tmp_path: Path) -> None:
    """Helm's --set types ``true`` as a boolean (helm pkg/strvals/parser.go, typedVal); a nodeSelector takes strings."""
    variables, install = _dcgm_install()
    chart = _stand_in_chart(tmp_path)
    command = install.replace("helm upgrade --install", "helm template")
    command = command.replace("gpu-helm-charts/dcgm-exporter", str(chart))
    command = re.sub(r'--version\s+"\$\w+"', "", command)
    (pod,) = load_all(_bash(f"{variables}\n{command}"))
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert isinstance(pod["spec"]["nodeSelector"]["nvidia.com/gpu.present"], str)
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["containers"][0]["args"] == ["-f", "/etc/dcgm-exporter/dcp-metrics-included.csv"]


@pytest.mark.parametrize("flag", ["--set", "--set-string"])
def test_helm_types_the_node_selector_as_the_quickstart_says(tmp_path: Path, flag: str) -> None:
    """The premise, held against the real helm: ``--set`` makes a boolean, ``--set-string`` a string."""
    chart = _stand_in_chart(tmp_path)
    (pod,) = load_all(_bash(f"helm template x {chart} {flag} 'nodeSelector.nvidia\\.com/gpu\\.present=true'"))
    value = pod["spec"]["nodeSelector"]["nvidia.com/gpu.present"]
    assert value == ("true" if flag == "--set-string" else True)
