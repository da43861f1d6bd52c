"""onSuspectNode exclude: which suspects are excluded under the caps, and the node patches that do it.

Against the real API server: tests/operator/controller/test_operator_e2e.py::
test_a_suspect_node_is_excluded_its_pods_restarted_and_the_taint_lifted_when_due and
test_the_cluster_cap_holds_across_trainings_judged_in_the_same_node_check; the whole
flow on the local cluster (a straggler's node excluded, the job resumed elsewhere):
tests/e2e/test_stall.py::test_a_straggler_node_is_excluded_and_the_training_resumes_elsewhere.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from fsdp_api.contract import EXCLUDED_BY_ANNOTATION, EXCLUDED_NODE_TAINT, EXCLUDED_UNTIL_ANNOTATION
from fsdp_localcluster.binaries import REPO_ROOT
from fsdp_operator.controller.node_exclusion import (
    CLUSTER_CAP_ENV,
    DEFAULT_CLUSTER_CAP,
    MAX_EXCLUDE_SECONDS_ENV,
    WORKLOAD_EVIDENCE_ENV,
    TaintLedger,
    due,
    exclude_seconds,
    lift_patch,
    node_side_only,
    plan,
    taint_patch,
)
from fsdp_operator.controller.nodes.health import NodeHealth, SuspectNode, node_health


def suspects(*names: str) -> tuple[SuspectNode, ...]:
    return tuple(SuspectNode(n, (f"{n}-pod",), ("AcceleratedHardwareReady=False (NvidiaXID79Error)",)) for n in names)


def test_the_training_cap_and_the_cluster_cap_each_hold() -> None:
    # Room for both.
    assert [s.node for s in plan(suspects("a", "b"), 2, 0, set(), 3).exclude] == ["a", "b"]
    # The training used one of its two already: one more, and the message says why not the other.
    chosen = plan(suspects("a", "b"), 2, 1, set(), 3)
    assert [s.node for s in chosen.exclude] == ["a"]
    assert chosen.note == "not excluded: this training has excluded 1 node(s), its limit (health.maxExcludedNodes)"
    # Every node looks bad (a systemic fault): the cluster's cap of 3 tainted at once holds.
    chosen = plan(suspects("a", "b", "c", "d"), 64, 0, {"x", "y"}, 3)
    assert [s.node for s in chosen.exclude] == ["a"]
    assert (
        chosen.note
        == f"not excluded: 2 node(s) of the cluster are excluded already, the operator's limit ({CLUSTER_CAP_ENV})"
    )
    # A node another training excluded already costs the cluster nothing more: this training's pods leave it too.
    assert [s.node for s in plan(suspects("x"), 2, 0, {"x", "y", "z"}, 3).exclude] == ["x"]


def test_only_node_side_evidence_excludes_unless_the_admin_allows_the_trainings_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = [{"metadata": {"name": f"p{i}"}, "spec": {"nodeName": n}} for i, n in enumerate(("bad-gpu", "late"))]
    nodes = {"bad-gpu": {}, "late": {}}
    health = node_health(pods, nodes, stragglers={"late": ["straggler: rank 1"]}, xids={"bad-gpu": ["XID 79"]})
    assert health is not None
    assert [(s.node, s.node_side) for s in health.suspects] == [("bad-gpu", True), ("late", False)]
    monkeypatch.delenv(WORKLOAD_EVIDENCE_ENV, raising=False)
    kept, why = node_side_only(health.suspects)
    assert [s.node for s in kept] == ["bad-gpu"]
    assert why is not None and why.startswith("not excluded: late only on the training's own evidence")
    monkeypatch.setenv(WORKLOAD_EVIDENCE_ENV, "true")
    assert node_side_only(health.suspects) == (health.suspects, None)


def test_the_operators_cap_on_exclude_seconds_wins_over_a_longer_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_EXCLUDE_SECONDS_ENV, raising=False)
    assert (exclude_seconds(3600), exclude_seconds(604_800)) == (3600, 86_400)
    monkeypatch.setenv(MAX_EXCLUDE_SECONDS_ENV, "600")
    assert exclude_seconds(3600) == 600


def test_a_checks_ledger_counts_the_tainted_nodes_less_the_ones_it_lifted() -> None:
    tainted = {"spec": {"taints": [{"key": EXCLUDED_NODE_TAINT, "value": "suspect", "effect": "NoSchedule"}]}}
    nodes = {"a": tainted, "b": tainted, "c": {"spec": {}}}
    assert TaintLedger.of(nodes).tainted == {"a", "b"}
    # A taint the check has just lifted no longer counts against the cap (the node list predates it).
    assert TaintLedger.of(nodes, lifted=["b"]).tainted == {"a"}


NODE = {
    "metadata": {"name": "gpu-1", "resourceVersion": "42", "labels": {"karpenter.sh/nodepool": "gpu"}},
    "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
}


def test_the_taint_patch_keeps_other_taints_and_is_guarded_by_the_resource_version() -> None:
    patch = taint_patch(NODE, "2026-11-29T01:00:00Z", "ml/llama: straggler")
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["metadata"]["labels"] == {EXCLUDED_NODE_TAINT: "true"}
    assert patch["metadata"]["annotations"] == {
        EXCLUDED_UNTIL_ANNOTATION: "2026-11-29T01:00:00Z",
        EXCLUDED_BY_ANNOTATION: "ml/llama: straggler",
    }
    assert patch["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
        {"key": EXCLUDED_NODE_TAINT, "value": "suspect", "effect": "NoSchedule"},
    ]
    tainted = {
        "metadata": {**NODE["metadata"], "annotations": patch["metadata"]["annotations"]},
        "spec": patch["spec"],
    }
    lifted = lift_patch(tainted)
    assert lifted["spec"]["taints"] == NODE["spec"]["taints"]
    assert lifted["metadata"]["annotations"] == {EXCLUDED_UNTIL_ANNOTATION: None, EXCLUDED_BY_ANNOTATION: None}
    assert lifted["metadata"]["labels"] == {EXCLUDED_NODE_TAINT: None}
    # Due once its time is up; a node without our taint never is; our taint with a time we cannot read is lifted.
    assert not due(tainted, datetime(2026, 11, 29, 0, 59, tzinfo=UTC))
    assert due(tainted, datetime(2026, 11, 29, 1, 0, tzinfo=UTC))
    assert not due(NODE, datetime(2030, 1, 1, tzinfo=UTC))
    unreadable = {
        "metadata": {"name": "n", "annotations": {EXCLUDED_UNTIL_ANNOTATION: "soon"}},
        "spec": tainted["spec"],
    }
    assert due(unreadable, datetime(2020, 1, 1, tzinfo=UTC))
    # The same taint set by hand (none of our annotations) is the admin's: never lifted.
    assert not due({"metadata": {"name": "n"}, "spec": tainted["spec"]}, datetime(2030, 1, 1, tzinfo=UTC))


def test_the_message_says_what_was_done_about_the_suspects() -> None:
    health = NodeHealth(2, suspects("gpu-1"), note="excluded gpu-1 and restarted the pods elsewhere")
    assert health.message() == (
        "node gpu-1 (pods gpu-1-pod): AcceleratedHardwareReady=False (NvidiaXID79Error); "
        "excluded gpu-1 and restarted the pods elsewhere"
    )


def test_the_installed_cluster_cap_is_the_operators_default() -> None:
    """The Deployment sets the cap for people to see and change; it must say what the code would do anyway."""
    deploy = yaml.safe_load((REPO_ROOT / "kustomize/manager/manager.yaml").read_text())
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[CLUSTER_CAP_ENV] == str(DEFAULT_CLUSTER_CAP)
