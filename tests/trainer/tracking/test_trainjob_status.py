"""TrainJob.status.trainerStatus (Kubeflow Trainer v2.3): what rank 0 posts, and when it posts at all.

The post itself, through Trainer's real status server and its token check, is
tests/e2e/test_trainer_v2_harness.py::test_progress_reaches_the_trainjob_status_through_the_status_server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fsdp_api.contract import ENV_KUBEFLOW_STATUS_CA, ENV_KUBEFLOW_STATUS_TOKEN, ENV_KUBEFLOW_STATUS_URL
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.tracking import open_tracking
from fsdp_trainer.tracking.trainjob_status import MAX_METRICS, TrainJobStatusReporter

CFG = TrainerConfig.model_validate({"model": {"preset": "tiny"}, "training": {"maxSteps": 300}})
ENV = {
    ENV_KUBEFLOW_STATUS_URL: "https://127.0.0.1:1/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/b/status",
    ENV_KUBEFLOW_STATUS_CA: "/var/run/secrets/kubeflow/trainer/ca.crt",
    ENV_KUBEFLOW_STATUS_TOKEN: "/var/run/secrets/kubeflow/trainer/token",
}


def reporter() -> TrainJobStatusReporter:
    r = TrainJobStatusReporter.from_env(CFG, ENV)
    assert r is not None
    r._posted_at = float("inf")  # no post from write(): these tests read the payload only
    return r


def test_the_status_is_the_progress_the_remaining_time_and_the_last_values_within_the_servers_limits() -> None:
    r = reporter()
    assert r.status(datetime(2026, 11, 28, 12, 0, tzinfo=UTC)) == {
        "progressPercentage": 0,
        "lastUpdatedTime": "2026-11-28T12:00:00Z",
    }
    r.write(1, {"train/loss": 11.25, "train/step_duration_seconds": 3.0})
    r.write(2, {"train/loss": 10.5, "train/step_duration_seconds": 1.0, "train/mfu_ratio": float("nan")})
    status = r.status()
    assert status["progressPercentage"] == 0  # 2 of 300: the server takes whole percents, rounded down
    # The step time's moving average (3.0, then 3.0 + 0.1 * (1.0 - 3.0) = 2.8) times the 298 steps left.
    assert status["estimatedRemainingSeconds"] == round(298 * 2.8)
    assert status["metrics"] == [
        {"name": "train/loss", "value": "10.5"},
        {"name": "train/step_duration_seconds", "value": "1"},
    ]  # the last value of each series; NaN is no value
    r.write(300, {"train/loss": 1.0})
    assert r.status()["progressPercentage"] == 100 and r.status()["estimatedRemainingSeconds"] == 0
    r.write(301, {f"series/{i}/{'x' * 80}": 1.0 for i in range(400)})
    status = r.status()
    assert status["progressPercentage"] == 100
    assert len(status["metrics"]) == MAX_METRICS and all(len(m["name"]) <= 64 for m in status["metrics"])


def test_only_the_clusters_variables_turn_it_on() -> None:
    assert TrainJobStatusReporter.from_env(CFG, {}) is None
    said: list[str] = []
    assert open_tracking(CFG, on_drop=lambda n: None, say=said.append, env={}) is None
    tracking = open_tracking(CFG, on_drop=lambda n: None, say=said.append, env=ENV)
    assert tracking is not None
    [only] = tracking.trackers
    assert isinstance(only, TrainJobStatusReporter) and only.token_file == Path(ENV[ENV_KUBEFLOW_STATUS_TOKEN])
    tracking.close(timeout=1)


def test_a_status_server_that_does_not_answer_costs_a_counted_point_not_a_step(tmp_path: Path) -> None:
    import certifi
    from fsdp_api import contract

    (tmp_path / "token").write_text("projected-token\n")
    env = {**ENV, ENV_KUBEFLOW_STATUS_CA: certifi.where(), ENV_KUBEFLOW_STATUS_TOKEN: str(tmp_path / "token")}
    dropped: list[int] = []
    said: list[str] = []
    tracking = open_tracking(CFG, on_drop=dropped.append, say=said.append, env=env)  # port 1: nothing listens
    assert tracking is not None
    tracking.log(1, {contract.LOSS: 2.0})
    tracking.close(timeout=10)
    assert dropped == [1]
    assert said[0].startswith(
        "tracking: trainjob-status failed to send 1 points up to step 1: the TrainJob status server: URLError: "
    ), said
    assert "Connection refused" in said[0]
