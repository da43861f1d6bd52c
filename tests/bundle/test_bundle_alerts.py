"""The alert rules: valid for promtool, unit-tested with firing series, built on contract metrics only."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api.contract import ALL_SERIES as KNOWN
from fsdp_api.contract import ROUTER_COLLAPSED_UNUSED_RATIO

from tests.bundle.manifests import PROMETHEUS_RULE, metric_names

HERE = Path(__file__).resolve().parent
EXPECTED_ALERTS = {
    "FSDPTrainingNotProgressing",
    "FSDPTrainingThroughputCollapsed",
    "FSDPTrainingLossNaN",
    "FSDPTrainingCheckpointStale",
    "FSDPTrainingCheckpointUnloadable",
    "FSDPTrainingCheckpointUploadBehind",
    "FSDPTrainingRestarting",
    "FSDPTrainingInputBound",
    "FSDPTrainingStraggler",
    "FSDPTrainingRouterCollapsed",
    "FSDPTrainingGPUIdle",
    "FSDPGPUXidError",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool is missing: run `make system-deps` (tools/install-system-deps.sh)")
    return path


def rule_groups() -> dict[str, Any]:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert doc["kind"] == "PrometheusRule"
    return doc["spec"]


def rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups()["groups"] for r in g["rules"]]


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    """The PrometheusRule's spec as a plain rule file, next to a copy of alerts_test.yaml."""
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    return path


def test_promtool_check_rules(rules_file: Path) -> None:
    res = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


def test_promtool_unit_tests_fire_every_alert(rules_file: Path) -> None:
    res = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yaml"], cwd=rules_file.parent, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # Each alert must be shown firing at least once in the unit tests.
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert fired == EXPECTED_ALERTS


def test_promtool_unit_tests_can_fail(rules_file: Path) -> None:
    """A wrong expectation must make promtool fail, or the test above proves nothing."""
    test_file = rules_file.parent / "alerts_test.yaml"
    test_file.write_text(test_file.read_text().replace("finished 25m 0s ago", "finished 24m 0s ago"))
    res = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yaml"], cwd=rules_file.parent, capture_output=True, text=True
    )
    assert res.returncode != 0
    assert "FSDPTrainingNotProgressing" in res.stdout + res.stderr


def test_every_alert_is_documented_and_classified() -> None:
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert set(alerts) == EXPECTED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"].get("summary"), name
        assert rule["annotations"].get("description"), name
    monitoring_doc = (HERE.parents[1] / "docs" / "monitoring.md").read_text()
    missing = [name for name in alerts if name not in monitoring_doc]
    assert not missing, f"docs/monitoring.md does not describe {missing}"


def test_alerts_read_only_contract_metrics() -> None:
    for rule in rules():
        unknown = metric_names(rule["expr"]) - KNOWN
        assert not unknown, f"{rule.get('alert')}: unknown metrics {unknown}"


def test_the_router_alert_fires_where_the_status_says_collapsed() -> None:
    """One threshold: the alert's and status.router.collapsed's (fsdp_api.contract)."""
    [rule] = [r for r in rules() if r.get("alert") == "FSDPTrainingRouterCollapsed"]
    assert rule["expr"].strip().endswith(f"> {ROUTER_COLLAPSED_UNUSED_RATIO}"), rule["expr"]
