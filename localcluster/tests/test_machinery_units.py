"""The local cluster's plumbing, without a cluster (part of the fast suite).

The one bounded wait, the operator's command line in child-process mode (the
Deployment's own, ports moved), and the direction of the node agent's imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

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
