"""`make demo-cluster` (tools/demo_cluster.py): its Prometheus helpers, without starting a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_api.contract import LOSS

from tools import demo_cluster


def test_last_sample_is_the_newest_finite_one_of_any_series() -> None:
    # data.result of /api/v1/query_range: two series (e.g. a restarted pod), values as strings.
    rows = [
        {"metric": {"pod": "tiny-worker-0"}, "values": [[100.0, "9.5"], [101.0, "8.25"], [104.0, "NaN"]]},
        {"metric": {"pod": "tiny-worker-0", "instance": "b"}, "values": [[102.5, "7.125"], [103, "+Inf"]]},
    ]
    assert demo_cluster.last_sample(rows) == (102.5, 7.125)


@pytest.mark.parametrize("rows", [[], [{"metric": {}, "values": []}], [{"metric": {}, "values": [[1, "NaN"]]}]])
def test_no_finite_sample_is_none(rows: list[dict[str, object]]) -> None:
    assert demo_cluster.last_sample(rows) is None


def test_loss_query_selects_the_trainer_pods_by_the_podmonitor_labels() -> None:
    # The name the trainer exports (api/fsdp_api/contract.py), the labels PodMonitorPrometheus gives each target.
    assert demo_cluster.loss_query("tiny", "fsdp-training") == (
        f'{LOSS.name}{{namespace="fsdp-training",pod=~"tiny-worker-.*"}}'
    )
    assert LOSS.name == "fsdp_train_loss"


def test_a_missing_prometheus_binary_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PROMETHEUS_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no prometheus on it
    missing = demo_cluster.prometheus_missing()
    assert missing is not None and "\n" not in missing and "make system-deps" in missing


def test_a_present_prometheus_binary_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binary = tmp_path / "prometheus"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PROMETHEUS_BIN", str(binary))
    assert demo_cluster.prometheus_missing() is None


def test_the_dashboard_it_points_to_exists() -> None:
    assert demo_cluster.DASHBOARD.is_file()
