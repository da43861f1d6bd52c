"""The local cluster's plumbing, without a cluster (part of the fast suite).

The one bounded wait, the operator's command line in child-process mode (the
Deployment's own, ports moved), and the direction of the node agent's imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import cast

import pytest
from fsdp_localcluster.operator_install import OperatorProcess
from fsdp_localcluster.wait import WaitTimeout, wait_for

PACKAGE = Path(__file__).resolve().parents[1] / "fsdp_localcluster"

# The shape of kustomize/manager/manager.yaml's container.
CONTAINER = {
    "name": "operator",
    "args": [
        "run",
        "--all-namespaces",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--metrics-port=8081",
        "--peering=fsdp-operator",
    ],
    "env": [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "FSDP_OPERATOR_PRIORITY", "value": "100"},
        {"name": "FSDP_OPERATOR_SCRAPE_INTERVAL", "value": "30"},
    ],
}


def test_wait_for_returns_the_first_truthy_answer_and_retries_errors() -> None:
    answers = iter([None, RuntimeError("transient"), 0, {"ready": True}])

    def check() -> object:
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    assert wait_for(check, 5, "a ready answer", interval=0.01) == {"ready": True}


def test_wait_for_names_what_it_waited_for_and_the_last_answer() -> None:
    def check() -> None:
        raise AssertionError("still 1 pod")

    with pytest.raises(WaitTimeout, match=r"waiting for two pods; last: AssertionError\('still 1 pod'\)"):
        wait_for(check, 0.05, "two pods", interval=0.01)


def test_operator_process_runs_the_deployments_command_line_on_free_ports(tmp_path: Path) -> None:
    op = OperatorProcess(tmp_path / "kubeconfig", tmp_path / "log", container=CONTAINER, pod_name="op-0")
    assert op.command() == [
        str(Path(sys.executable).with_name("fsdp-operator")),
        "run",
        "--all-namespaces",
        f"--liveness=http://127.0.0.1:{op.liveness_port}/healthz",
        f"--metrics-port={op.metrics_port}",
        "--peering=fsdp-operator",
    ]
    assert op.environment() == {
        "POD_NAME": "op-0",
        "FSDP_OPERATOR_PRIORITY": "100",
        "FSDP_OPERATOR_SCRAPE_INTERVAL": "30",
    }


def test_operator_process_options_are_flags_and_env_comes_last(tmp_path: Path) -> None:
    op = OperatorProcess(
        tmp_path / "kubeconfig",
        tmp_path / "log",
        container=CONTAINER,
        namespace="team-a",
        priority=0,
        scrape_interval=0.5,
        env={"FSDP_OPERATOR_PRIORITY": "7"},
    )
    args = op.command()[1:]
    assert "--all-namespaces" not in args and "--namespace=team-a" in args
    assert args[-2:] == ["--priority=0", "--scrape-interval=0.5"]
    assert op.environment()["FSDP_OPERATOR_PRIORITY"] == "7"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_a_pod_worker_depends_on_its_context_not_on_the_agent() -> None:
    pods = imported_modules(PACKAGE / "node_agent" / "pods.py")
    assert ".agent" not in pods and "fsdp_localcluster.node_agent.agent" not in pods
    assert ".pods" in imported_modules(PACKAGE / "node_agent" / "agent.py")


def test_upstream_webhook_patches_apply_and_only_kept_webhooks_are_registered_by_url(tmp_path: Path) -> None:
    """JobSet's kustomize patch (replace /webhooks/1) and Trainer's (object selectors), as trainer_v2 applies them."""
    from fsdp_localcluster.apiserver import TestCluster
    from fsdp_localcluster.trainer_v2 import MUTATING
    from fsdp_localcluster.webhooks import json_patch, register_webhooks

    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(
        "---\napiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\n"
        "metadata: {name: mutating-webhook-configuration}\nwebhooks:\n"
        "- {name: mjobset.kb.io, clientConfig: {service: {name: s, path: /mutate-jobset}}}\n"
        "- {name: mpod.kb.io, clientConfig: {service: {name: s, path: /mutate--v1-pod}}}\n"
        "- {name: other.kb.io, clientConfig: {service: {name: s, path: /other}}}\n"
    )
    patch = tmp_path / "patch.yaml"
    selector = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    patch.write_text(
        "- op: add\n  path: /webhooks/1/objectSelector\n"
        "  value: {matchExpressions: [{key: jobset.sigs.k8s.io/jobset-name, operator: Exists}]}\n"
        "- op: replace\n  path: /metadata/name\n  value: patched\n"
    )
    applied: list[dict[str, object]] = []

    class Cluster:
        def apply(self, obj: dict[str, object]) -> None:
            applied.append(obj)

    register_webhooks(
        cast(TestCluster, Cluster()),  # register_webhooks only calls apply()
        manifests,
        {MUTATING: patch},
        {MUTATING: "jobset-mutating-webhook-configuration"},
        {"mjobset.kb.io", "mpod.kb.io"},
        9443,
        "Q0E=",
    )
    [cfg] = applied
    assert cfg["metadata"] == {"name": "jobset-mutating-webhook-configuration"}
    hooks = cfg["webhooks"]
    assert isinstance(hooks, list) and [h["name"] for h in hooks] == ["mjobset.kb.io", "mpod.kb.io"]
    assert hooks[1]["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate--v1-pod", "caBundle": "Q0E="}
    assert hooks[1]["objectSelector"] == selector and "objectSelector" not in hooks[0]
    assert all(h["timeoutSeconds"] == 10 for h in hooks)

    doc = {"webhooks": [{"name": "a"}, {"name": "b"}]}
    json_patch(doc, [{"op": "replace", "path": "/webhooks/1", "value": {"name": "c"}}])
    json_patch(doc, [{"op": "add", "path": "/webhooks/-", "value": {"name": "d"}}])
    assert doc == {"webhooks": [{"name": "a"}, {"name": "c"}, {"name": "d"}]}
    with pytest.raises(ValueError, match="remove"):
        json_patch(doc, [{"op": "remove", "path": "/webhooks/0"}])


FAKE_CTR = """#!/bin/sh
# ctr for the test: 'images import' fails once as a half-done earlier import leaves the store.
log="{log}"
echo "$*" >> "$log"
case "$*" in
  *"images import"*)
    cat > /dev/null
    if [ ! -e "$log.failed" ]; then
      touch "$log.failed"
      echo "ctr: failed to prepare extraction snapshot: parent snapshot sha256:99 does not exist: not found" >&2
      exit 1
    fi ;;
esac
exit 0
"""
FAKE_BUILDAH = """#!/bin/sh
case "$1" in inspect) echo build-7 ;; push) echo image-bytes ;; esac
"""


def test_an_import_the_store_cannot_unpack_is_done_again_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """containerd's store outlives a node; an import on a store with a missing parent snapshot is redone."""
    from fsdp_localcluster.kubelet_node import KubeletNode

    bin_dir, log = tmp_path / "bin", tmp_path / "ctr.log"
    bin_dir.mkdir()
    for name, text in (("ctr", FAKE_CTR.format(log=log)), ("buildah", FAKE_BUILDAH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    node = KubeletNode.__new__(KubeletNode)
    node.socket = tmp_path / "containerd.sock"
    node.load_image("localhost/trainer:local")
    calls = [line.split(" ", 4)[-1] for line in log.read_text().splitlines()]
    assert [c for c in calls if "import" in c or " rm " in f" {c} " or "label" in c] == [
        "images import -",
        "images rm localhost/trainer:local",
        "images import -",
        "images label localhost/trainer:local fsdp-k8s.dev/buildah-image-id=build-7",
    ]
