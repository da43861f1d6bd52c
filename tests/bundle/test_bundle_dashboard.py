"""The Grafana dashboard, statically: variables, panels, filters, PromQL syntax, one shipped copy."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fsdp_api.contract import ALL_SERIES as KNOWN
from fsdp_api.contract import DCGM_METRICS, exposed_series
from fsdp_localcluster.binaries import vendored_crds

from tests.bundle import dashboard
from tests.bundle.manifests import DASHBOARD, kustomize

TRAINER_METRICS = exposed_series(gpu=False)

SHARED_DCGM = vendored_crds("dcgm-exporter")

# What the dashboard promises to show: panel title -> metrics it must read.
REQUIRED_PANELS = {
    "Loss": {"fsdp_train_loss", "fsdp_train_eval_loss"},
    "Expert load per MoE layer": {"fsdp_moe_expert_load_max_ratio", "fsdp_moe_expert_load_min_ratio"},
    "Unused experts per MoE layer": {"fsdp_moe_experts_unused_ratio"},
    "Router load-balancing loss": {"fsdp_moe_router_aux_loss"},
    "Learning rate": {"fsdp_train_learning_rate"},
    "Tokens/s (global)": {"fsdp_train_global_tokens_per_second"},
    "Tokens/s per GPU": {"fsdp_train_tokens_per_second"},
    "MFU per GPU": {"fsdp_train_mfu_ratio"},
    "TFLOP/s per GPU": {"fsdp_train_tflops"},
    "Step time": {"fsdp_train_step_duration_seconds_bucket"},
    "Data-loading share": {"fsdp_train_data_wait_seconds_total", "fsdp_train_step_duration_seconds_sum"},
    "Stragglers: peers' wait per rank": {
        "fsdp_train_rank_lateness_seconds_total",
        "fsdp_train_step_duration_seconds_count",
        "fsdp_train_step_duration_seconds_sum",
    },
    "Excluded nodes": {"fsdp_operator_node_exclusions_total"},
    "Peak memory per rank": {"fsdp_train_memory_peak_bytes"},
    "Checkpoint age": {"fsdp_checkpoint_last_save_timestamp_seconds"},
    "Checkpoint save duration": {"fsdp_checkpoint_save_duration_seconds_sum"},
    "Restarts": {"fsdp_train_restart_count"},
    "GPU utilisation": {"DCGM_FI_DEV_GPU_UTIL"},
    "Tensor core activity": {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"},
    "GPU memory used": {"DCGM_FI_DEV_FB_USED"},
    "GPU power": {"DCGM_FI_DEV_POWER_USAGE"},
    "XID errors": {"DCGM_FI_DEV_XID_ERRORS"},
}

# A trainer-metric selector: metric name followed by its {...} matchers.
SELECTOR = re.compile(r"\b(fsdp_[a-z0-9_]+)\s*(\{[^}]*\})?")


def test_template_variables() -> None:
    v = dashboard.variables()
    assert v["datasource"]["type"] == "datasource" and v["datasource"]["query"] == "prometheus"
    assert v["namespace"]["definition"] == "label_values(fsdp_trainer_info, namespace)"
    # The job variable is the job_name label (Prometheus reserves "job" for the scrape job).
    assert v["job"]["definition"] == 'label_values(fsdp_trainer_info{namespace="$namespace"}, job_name)'
    assert "node_rank" in v["node"]["definition"]
    assert v["node"]["multi"] and v["node"]["includeAll"] and v["node"]["allValue"] == ".*"
    # Every panel queries through the datasource variable, so the dashboard imports anywhere.
    for p in dashboard.panels():
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_required_panels_read_the_right_metrics() -> None:
    reads: dict[str, set[str]] = {}
    for q in dashboard.queries():
        reads.setdefault(q.panel, set()).update(q.metrics)
    for title, metrics in REQUIRED_PANELS.items():
        assert title in reads, f"no panel titled {title!r}"
        assert metrics <= reads[title], f"{title}: reads {reads[title]}, expected {metrics}"


def test_every_trainer_selector_is_scoped_to_the_selected_job() -> None:
    for q in dashboard.queries():
        for name, matchers in SELECTOR.findall(q.expr):
            assert matchers, f"{q.panel}/{q.ref}: {name} without label matchers"
            assert 'namespace="$namespace"' in matchers and 'job_name="$job"' in matchers, f"{q.panel}/{q.ref}"


def test_queries_read_only_contract_metrics() -> None:
    for q in dashboard.queries():
        assert q.metrics, f"{q.panel}/{q.ref} reads no known metric: {q.expr}"
        assert q.metrics <= KNOWN, f"{q.panel}/{q.ref}: unknown metrics {q.metrics - KNOWN}"
    used = {m for q in dashboard.queries() for m in q.metrics}
    # Every contract gauge the trainer exports is shown somewhere (histograms via one of their series).
    shown = {m.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for m in used}
    expected = {m.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for m in TRAINER_METRICS}
    # The tracker run's address is a label for the status (status.trackerRuns), not a figure to plot.
    # The time a rank began to wait for its peers is the operator's (the Stalled message), 0 between steps.
    operator_only = {
        "fsdp_train_peak_tflops",
        "fsdp_tracker_run_info",
        "fsdp_train_peer_wait_started_timestamp_seconds",
    }
    assert expected - shown <= operator_only, expected - shown


def test_dcgm_queries_handle_both_pod_label_layouts() -> None:
    """honorLabels: pod/namespace; without it: exported_pod/exported_namespace. Both must match."""
    for q in dashboard.queries():
        if q.metrics & DCGM_METRICS:
            assert '"pod", "$1", "exported_pod"' in q.expr, q.panel
            assert '"namespace", "$1", "exported_namespace"' in q.expr, q.panel


def test_dcgm_fields_exist_in_dcgm_exporter() -> None:
    fields = set()
    for csv in ("default-counters.csv", "dcp-metrics-included.csv"):
        for line in (SHARED_DCGM / csv).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                fields.add(line.split(",")[0].strip())
    assert fields >= DCGM_METRICS, DCGM_METRICS - fields


def test_layout_has_unique_ids_and_no_overlap() -> None:
    ps = dashboard.panels()
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in ps:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expression (variables substituted) as a recording rule."""
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.fail("promtool is missing: run `make system-deps`")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": q.substituted("ns", "job")}
        for i, q in enumerate(dashboard.queries())
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_kustomize_ships_the_json_as_a_grafana_dashboard_configmap() -> None:
    cms = [o for o in kustomize("overlays/monitoring") if o["kind"] == "ConfigMap"]
    assert len(cms) == 1
    cm = cms[0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    # No hash suffix: the sidecar and `kubectl apply` update it in place.
    assert cm["metadata"]["name"] == "fsdp-training-dashboard"
    assert cm["data"]["fsdp-training.json"] == DASHBOARD.read_text()
    assert json.loads(cm["data"]["fsdp-training.json"])["uid"] == "fsdp-training"
