"""spec.tracking.mlflow against MLflow's own tracking server: one run per training, each step once, never waited for."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_api import contract
from fsdp_api.contract import ENV_TRAINING_IMAGE, ENV_TRAINING_UID, MLFLOW_RUN_FILE
from fsdp_api.local_process import local_env
from fsdp_api.ports import free_port
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.tracking import Tracking
from fsdp_trainer.tracking.mlflow import MlflowTracker, flat_params, preflight
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

from tests.trainer.tracking.mlflow_server import MlflowServer
from tests.trainer.tracking.stand_in import answering_server, dns_answers


def config(tmp_path: Path, uri: str, experiment: str, **mlflow: Any) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": "llama-ft", "namespace": "team-a"},
            "model": {"preset": "tiny"},
            "training": {"maxSteps": 10, "learningRate": 3e-4},
            "checkpoint": {"dir": str(tmp_path / "checkpoints")},
            "tracking": {"mlflow": {"uri": uri, "experiment": experiment, **mlflow}},
        }
    )


def client(server: MlflowServer) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.uri)


def losses(server: MlflowServer, run_id: str) -> list[tuple[int, float]]:
    history = client(server).get_metric_history(run_id, "train/loss")
    return sorted((m.step, m.value) for m in history)


def runs_of(server: MlflowServer, experiment: str) -> list[Any]:
    found = client(server).get_experiment_by_name(experiment)
    return client(server).search_runs([found.experiment_id]) if found else []


def test_params_are_the_flattened_config_cut_to_mlflows_limit() -> None:
    params = flat_params({"training": {"lr": 3e-4, "betas": [0.9, 0.95]}, "peft": {}, "data": {"text": "x" * 7000}})
    assert params == {"training.lr": "0.0003", "training.betas": "[0.9, 0.95]", "peft": "{}", "data.text": "x" * 6000}


def test_one_run_carries_the_config_and_identity_and_a_resumed_process_continues_it_each_step_once(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TRAINING_UID, "0b6f1c9e-7d7e-4e59-9f3a-2f0c1d2e3f40")
    monkeypatch.setenv(ENV_TRAINING_IMAGE, "ghcr.io/fsdp-k8s/trainer:0.1.0")
    cfg = config(tmp_path, mlflow_server.uri, "resume")
    first = MlflowTracker.from_config(cfg)
    for step in range(1, 8):  # checkpoint at 5; steps 6 and 7 are trained again after the kill
        first.write(step, {"train/loss": 10.0 - step, "train/learning_rate": 3e-4})
    first.flush()  # a SIGKILL: no close, so the run is never ended by this process

    resumed = MlflowTracker.from_config(cfg)
    for step in range(6, 11):
        resumed.write(step, {"train/loss": 20.0 - step, "train/learning_rate": 3e-4})
    resumed.close()

    [run] = runs_of(mlflow_server, "resume")
    assert run.info.run_id == first.run_id == resumed.run_id
    assert resumed.logged_through == 7
    # Steps 6 and 7 keep the first process's values (MLflow cannot replace a point); 8-10 are the resumed one's.
    assert losses(mlflow_server, run.info.run_id) == [(s, 10.0 - s) for s in range(1, 8)] + [
        (s, 20.0 - s) for s in range(8, 11)
    ]
    assert run.info.status == "FINISHED" and run.info.run_name == "llama-ft"
    assert {k: v for k, v in run.data.tags.items() if k.startswith("fsdp.")} == {
        "fsdp.training": "llama-ft",
        "fsdp.namespace": "team-a",
        "fsdp.model": "tiny",
        "fsdp.image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
        "fsdp.uid": "0b6f1c9e-7d7e-4e59-9f3a-2f0c1d2e3f40",
    }
    assert run.data.params["training.maxSteps"] == "10" and run.data.params["training.learningRate"] == "0.0003"
    assert run.data.params["tracking.mlflow.experiment"] == "resume"
    kept = json.loads((tmp_path / "checkpoints" / MLFLOW_RUN_FILE).read_text())
    assert kept == {"run_id": run.info.run_id, "uri": mlflow_server.uri, "experiment": "resume"}


def test_a_process_stopped_before_the_last_step_leaves_the_run_killed_until_it_resumes(
    tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    cfg = config(tmp_path, mlflow_server.uri, "sigterm", runName="attempts")
    first = MlflowTracker.from_config(cfg)
    first.write(1, {"train/loss": 2.0})
    first.close()  # a SIGTERM at step 1 of 10
    [run] = runs_of(mlflow_server, "sigterm")
    assert run.info.status == "KILLED" and run.info.run_name == "attempts"
    resumed = MlflowTracker.from_config(cfg)
    resumed.write(2, {"train/loss": 1.0})
    assert client(mlflow_server).get_run(run.info.run_id).info.status == "RUNNING"
    resumed.close()


def test_resume_never_starts_a_new_run_and_a_run_deleted_on_the_server_is_replaced(
    tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    never = config(tmp_path, mlflow_server.uri, "afresh").model_copy(deep=True)
    never.checkpoint.resume = "never"
    ids = []
    for _ in range(2):
        tracker = MlflowTracker.from_config(never)
        tracker.write(1, {"train/loss": 2.0})
        tracker.close()
        ids.append(tracker.run_id)
    assert len(set(ids)) == 2 and {r.info.run_id for r in runs_of(mlflow_server, "afresh")} == set(ids)

    auto = config(tmp_path, mlflow_server.uri, "afresh")
    client(mlflow_server).delete_run(ids[-1])
    replaced = MlflowTracker.from_config(auto)
    replaced.write(1, {"train/loss": 2.0})
    replaced.close()
    assert replaced.run_id not in ids and losses(mlflow_server, replaced.run_id) == [(1, 2.0)]


class Forwarder:
    """A TCP relay in front of the server that can be cut: the server 'stops' for the client."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        self.cut_off = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut_off.is_set():
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def cut(self) -> None:
        self.cut_off.set()
        # A blocked accept() keeps a closed socket listening on Linux: shutdown wakes it first.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_a_server_that_stops_mid_run_costs_points_not_steps(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the default 2 retries only make this slower
    relay = Forwarder(mlflow_server.port)
    tracker = MlflowTracker.from_config(config(tmp_path, relay.uri, "outage", flushSeconds=600))
    counted: list[int] = []
    said: list[str] = []
    tracking = Tracking([tracker], 100, on_drop=counted.append, say=said.append)
    for step in range(1, 6):
        tracking.log(step, {contract.LOSS: 1.0})
    assert tracking.sync(timeout=60)  # steps 1-5 are on the server
    relay.cut()
    for step in range(6, 11):
        tracking.log(step, {contract.LOSS: 1.0})
    tracking.close(timeout=60)
    assert losses(mlflow_server, tracker.run_id) == [(s, 1.0) for s in range(1, 6)]
    # Steps 6-10 were sent in one request at close, which failed: five points, counted once each.
    assert tracking.dropped == sum(counted) == 5
    assert said[0].startswith("tracking: mlflow failed to send its last 5 points: ")
    assert said[-1] == "tracking: 5 points were dropped in all (fsdp_tracker_points_dropped_total)"


# --- the pod's check --------------------------------------------------------------------------


@pytest.fixture
def http_answer() -> Iterator[dict[str, Any]]:
    """A plain HTTP server on loopback: not MLflow."""
    with answering_server(404, b"<html>not found</html>") as state:
        state["uri"] = state["url"]
        yield state


def spec_for(uri: str) -> Any:
    return config(Path("/tmp"), uri, "check").tracking.mlflow


def test_the_check_passes_a_real_server_whether_or_not_it_has_the_experiment(mlflow_server: MlflowServer) -> None:
    assert preflight(spec_for(mlflow_server.uri), {}) == ([], [])
    client(mlflow_server).create_experiment("check")
    assert preflight(spec_for(mlflow_server.uri + "/"), {}) == ([], [])


def test_the_check_warns_of_a_server_that_does_not_answer_and_refuses_a_host_that_does_not_resolve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    errors, warnings = preflight(spec_for(f"http://127.0.0.1:{port}"), {})
    assert errors == [] and len(warnings) == 1
    assert warnings[0].startswith(f"tracking.mlflow.uri http://127.0.0.1:{port} does not answer now (")
    assert "points are dropped" in warnings[0]
    typo = "http://mlflow.no-such-namespace.invalid:5000"
    dns_answers(monkeypatch, socket.EAI_NONAME, "Name or service not known")
    assert preflight(spec_for(typo), {}) == (
        [f"tracking.mlflow.uri {typo}: the host does not resolve (Name or service not known)"],
        [],
    )
    # DNS having a bad moment ("try again") may pass: a warning, and training starts.
    dns_answers(monkeypatch, socket.EAI_AGAIN, "Temporary failure in name resolution")
    errors, warnings = preflight(spec_for(typo), {})
    assert errors == [] and warnings[0].startswith(f"tracking.mlflow.uri {typo} does not answer now (")


def test_the_check_refuses_an_address_that_is_not_mlflow_and_credentials_the_server_refuses(
    http_answer: dict[str, Any],
) -> None:
    uri = http_answer["uri"]
    errors, _ = preflight(spec_for(uri), {})
    assert errors == [
        f"tracking.mlflow.uri {uri} does not answer as an MLflow tracking server (HTTP 404 from "
        f"{uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name=check)"
    ]
    http_answer["status"], http_answer["body"] = 401, b""
    errors, _ = preflight(spec_for(uri), {})
    assert errors == [
        f"tracking.mlflow.uri {uri} refused a request without credentials (set MLFLOW_TRACKING_TOKEN, or "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, from a Secret in spec.env) (HTTP 401)"
    ]
    errors, _ = preflight(spec_for(uri), {"MLFLOW_TRACKING_TOKEN": "t0ken"})
    assert errors == [f"tracking.mlflow.uri {uri} refused MLFLOW_TRACKING_TOKEN (HTTP 401)"]
    assert http_answer["seen"][-1][1] == "Bearer t0ken"
    # A server that answers it cannot serve now (an upgrade, a proxy without its backend, a rate limit)
    # may be back before the first point: a warning, and training starts.
    for status in (503, 429, 502):
        http_answer["status"], http_answer["body"] = status, b"<html>unavailable</html>"
        errors, warnings = preflight(spec_for(uri), {})
        assert errors == [] and warnings == [
            f"tracking.mlflow.uri {uri} answered HTTP {status} now: training starts, and its points are dropped "
            "(fsdp_tracker_points_dropped_total) until the server answers"
        ]
    # MLflow's client sends basic credentials when both kinds are set, and so does the check.
    both = {"MLFLOW_TRACKING_TOKEN": "t", "MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}
    preflight(spec_for(uri), both)
    assert http_answer["seen"][-1][1] == "Basic dTpw"


def test_the_client_reports_no_usage_and_gives_up_sooner_unless_the_pod_says_otherwise(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MLFLOW_DISABLE_TELEMETRY", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")  # the pod's own choice
    tracker = MlflowTracker.from_config(config(tmp_path, mlflow_server.uri, "defaults"))
    tracker.write(1, {"train/loss": 1.0})
    tracker.close()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"


# One trainer process's metrics, a separate interpreter since multiprocess mode is global: rank 0
# exports the run's page as soon as the writer thread has opened the run.
RUN_URL_WORKER = textwrap.dedent(
    """
    import io, sys, time, urllib.request
    from types import SimpleNamespace
    import torch
    from fsdp_api.trainer_config import TrainerConfig
    from fsdp_trainer.metrics import MetricsProcessor, StepStats
    from fsdp_trainer.metrics.flops import FlopsShape

    port, uri, ckpt, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    cfg = TrainerConfig.model_validate({"job": {"name": "linked"}, "model": {"preset": "tiny"},
                                        "training": {"maxSteps": 10}, "metrics": {"port": port},
                                        "checkpoint": {"dir": ckpt},
                                        "tracking": {"mlflow": {"uri": uri, "experiment": "linked"}}})
    world = SimpleNamespace(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                            num_nodes=1, device=torch.device("cpu"))
    proc = MetricsProcessor(cfg, world, 1000, seq_len=16, flops=FlopsShape(1000, 2, 64), stream=io.StringIO())
    proc.start()
    step = 0
    deadline = time.monotonic() + 60
    while not proc.tracking.run_urls() and time.monotonic() < deadline:
        step += 1
        proc.on_step(StepStats(step=step, loss=1.0, learning_rate=0.1, grad_norm=1.0, tokens=64,
                               step_seconds=0.2, data_seconds=0.0))
        time.sleep(0.2)
    proc.on_step(StepStats(step=step + 1, loss=1.0, learning_rate=0.1, grad_norm=1.0, tokens=64,
                           step_seconds=0.2, data_seconds=0.0))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r, open(out, "w") as f:
        f.write(r.read().decode())
    proc.close()
    """
)


def test_rank_0_exports_the_runs_page_for_the_status(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    from fsdp_operator.controller.progress import parse_trainer_metrics

    worker = tmp_path / "worker.py"
    worker.write_text(RUN_URL_WORKER)
    env = local_env(1, metrics_dir=tmp_path / "metrics-files")
    scrape = tmp_path / "scrape.txt"
    args = [str(free_port()), mlflow_server.uri, str(tmp_path / "checkpoints"), str(scrape)]
    done = subprocess.run([sys.executable, str(worker), *args], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = runs_of(mlflow_server, "linked")
    url = f"{mlflow_server.uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    # What the operator reads from the endpoint, and writes to status.trackerRuns.
    assert parse_trainer_metrics(scrape.read_text()).status_fields()["trackerRuns"] == {"mlflow": url}


def test_a_server_error_while_finding_the_kept_run_does_not_start_a_second_run(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    cfg = config(tmp_path, mlflow_server.uri, "flaky")
    first = MlflowTracker.from_config(cfg)
    first.write(1, {"train/loss": 2.0})
    first.flush()

    real_get_run = MlflowClient.get_run
    failures = iter([MlflowException("503 Service Unavailable", error_code=TEMPORARILY_UNAVAILABLE)])

    def flaky_get_run(self: Any, run_id: str) -> Any:
        if (error := next(failures, None)) is not None:
            raise error
        return real_get_run(self, run_id)

    monkeypatch.setattr(MlflowClient, "get_run", flaky_get_run)
    resumed = MlflowTracker.from_config(cfg)
    with pytest.raises(MlflowException):  # this point is dropped and counted by the writer thread
        resumed.write(2, {"train/loss": 1.5})
    resumed.write(3, {"train/loss": 1.0})  # the next point opens it again
    resumed.close()
    assert resumed.run_id == first.run_id and len(runs_of(mlflow_server, "flaky")) == 1
    assert losses(mlflow_server, first.run_id) == [(1, 2.0), (3, 1.0)]


def test_samples_are_a_markdown_artifact_of_the_run_per_step(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    tracker = MlflowTracker.from_config(config(tmp_path, mlflow_server.uri, "samples"))
    tracker.write(5, {"train/loss": 1.0})
    tracker.write_samples(5, [("2 + 2 =", "4 | four"), ("Hello", "")])
    tracker.close()
    [run] = runs_of(mlflow_server, "samples")
    [folder] = client(mlflow_server).list_artifacts(run.info.run_id)
    assert folder.path == "samples"
    [artifact] = client(mlflow_server).list_artifacts(run.info.run_id, "samples")
    assert artifact.path == "samples/step-00000005.md"
    local = client(mlflow_server).download_artifacts(run.info.run_id, artifact.path, str(tmp_path))
    assert Path(local).read_text() == (
        "Samples at step 5\n\n| prompt | completion |\n| --- | --- |\n| 2 + 2 = | 4 \\| four |\n| Hello |   |\n"
    )
