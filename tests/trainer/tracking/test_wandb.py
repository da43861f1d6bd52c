"""spec.tracking.wandb with W&B's own client: one run per training, each step once, checked before the launch.

The runs are offline (W&B's client writing its run files; there is no W&B
server to start from a package registry), read back from those files. What
only a W&B server could show (the online resume through ``starting_step``,
the run's page) is said in docs/tracking.md.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_api.contract import ENV_TRAINING_IMAGE, ENV_TRAINING_UID, ENV_WANDB_API_KEY, WANDB_RUN_FILE, WANDB_SUBDIR
from fsdp_api.ports import free_port
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.tracking.wandb import WandbTracker, preflight
from fsdp_trainer.tracking.wandb_log import history, records, run_files

from tests.trainer.tracking.stand_in import answering_server, dns_answers

# Enough series per step that a step's record is longer than half of W&B's 32 KiB log block:
# records then span blocks, in first/middle/last pieces, which the reader must join.
WIDE = {f"layers/{i}/grad_norm": float(i) for i in range(600)}


def config(tmp_path: Path, resume: str = "auto", **wandb: Any) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": "llama-ft", "namespace": "team-a"},
            "model": {"preset": "tiny"},
            "training": {"maxSteps": 10, "learningRate": 3e-4},
            "checkpoint": {"dir": str(tmp_path / "checkpoints"), "resume": resume},
            "tracking": {"wandb": {"project": "fsdp-tests", "mode": "offline", **wandb}},
        }
    )


def exit_codes(path: Path) -> list[int]:
    return [r.exit.exit_code for r in records(path) if r.WhichOneof("record_type") == "exit"]


class _OneSecond:
    """W&B's clock, stopped at one instant: every process of a test starts in the same second."""

    def __init__(self, instant: float) -> None:
        self.instant = instant

    def time(self) -> float:
        return self.instant

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def one_start_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``wandb.init`` of the test starts at the same wall-clock second.

    W&B names an offline process's folder by its start to the second and adds
    ``-1``, ``-2`` to a name that is taken: the processes of one run started
    within a second (a crash and a fast restart; this suite on a busy machine)
    then differ only by that suffix. Pinned here, so the suffixes always appear.
    """
    from wandb.sdk import wandb_init

    monkeypatch.setattr(wandb_init, "time", _OneSecond(time.time()))


def test_an_offline_run_carries_the_config_and_identity_and_resumed_processes_continue_it_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_start_second: None
) -> None:
    monkeypatch.setenv(ENV_TRAINING_UID, "0b6f1c9e-7d7e-4e59-9f3a-2f0c1d2e3f40")
    monkeypatch.setenv(ENV_TRAINING_IMAGE, "ghcr.io/fsdp-k8s/trainer:0.1.0")
    cfg = config(tmp_path)
    first = WandbTracker.from_config(cfg)
    for step in range(1, 8):  # checkpoint at 5; steps 6 and 7 are trained again after the stop
        first.write(step, {"train/loss": 10.0 - step, **WIDE})
    first.close()  # stopped before maxSteps: preempting, exit code 1

    second = WandbTracker.from_config(cfg)
    for step in range(6, 10):  # checkpoint at 8; step 9 is trained again
        second.write(step, {"train/loss": 20.0 - step})
    second.close()

    third = WandbTracker.from_config(cfg)
    for step in range(9, 11):
        third.write(step, {"train/loss": 30.0 - step})
    third.close()

    run_id = json.loads((tmp_path / "checkpoints" / WANDB_RUN_FILE).read_text())["run_id"]
    files = run_files(tmp_path / "checkpoints" / WANDB_SUBDIR, run_id)
    names = [path.parent.name for path in files]
    assert len({name.split("-")[2] for name in names}) == 1, f"not started in one second: {names}"
    assert [name.removeprefix(names[0]) for name in names] == ["", "-1", "-2"], "one offline folder per process"
    assert (second.logged_through, third.logged_through) == (7, 9)
    rows = [row for path in files for row in history(path)]
    assert [(r["_step"], r["train/loss"]) for r in rows] == [(s, 10.0 - s) for s in range(1, 8)] + [
        (8, 12.0),
        (9, 11.0),
        (10, 20.0),
    ]
    assert all(rows[i]["layers/599/grad_norm"] == 599.0 for i in range(7)), "records spanning log blocks"
    assert [exit_codes(path) for path in files] == [[1], [1], [0]]
    [run] = [r.run for r in records(files[0]) if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.project, run.display_name) == (run_id, "fsdp-tests", "llama-ft")
    config_values = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config_values["training"]["maxSteps"] == 10
    assert config_values["fsdp"] == {
        "training": "llama-ft",
        "namespace": "team-a",
        "model": "tiny",
        "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
        "uid": "0b6f1c9e-7d7e-4e59-9f3a-2f0c1d2e3f40",
    }
    assert third.url is None  # offline: no page; the status shows none


def test_the_offline_folders_of_a_run_are_ordered_by_start_then_suffix_and_no_other_run_is_taken(
    tmp_path: Path,
) -> None:
    names = [
        "offline-run-20261201_101011-abcd1234",
        "offline-run-20261201_101010-abcd1234-10",
        "offline-run-20261201_101010-abcd1234-2",
        "offline-run-20261201_101010-abcd1234",
        "offline-run-20261201_101010-abcd12345",  # another run whose id starts with this one
        "run-20261201_101010-abcd1234",  # an online run's folder
    ]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run-abcd1234.wandb").write_bytes(b"")
    assert [path.parent.name for path in run_files(tmp_path, "abcd1234")] == [
        "offline-run-20261201_101010-abcd1234",
        "offline-run-20261201_101010-abcd1234-2",
        "offline-run-20261201_101010-abcd1234-10",
        "offline-run-20261201_101011-abcd1234",
    ]


def test_resume_never_and_a_moved_project_start_a_new_run(tmp_path: Path) -> None:
    def one_run(cfg: TrainerConfig) -> str:
        tracker = WandbTracker.from_config(cfg)
        tracker.write(1, {"train/loss": 1.0})
        tracker.close()
        return json.loads((tmp_path / "checkpoints" / WANDB_RUN_FILE).read_text())["run_id"]

    kept = one_run(config(tmp_path))
    assert one_run(config(tmp_path)) == kept
    assert one_run(config(tmp_path, resume="never")) != kept
    moved = one_run(config(tmp_path, project="another-project"))
    assert moved != kept and one_run(config(tmp_path, project="another-project")) == moved


def test_the_client_reports_no_errors_to_sentry_and_writes_offline_files_often_unless_the_pod_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    monkeypatch.delenv("WANDB_ERROR_REPORTING", raising=False)
    monkeypatch.delenv("WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL", raising=False)
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "false")  # the pod's own choice
    tracker = WandbTracker.from_config(config(tmp_path))
    tracker.write(1, {"train/loss": 1.0})
    tracker.close()
    assert os.environ["WANDB_ERROR_REPORTING"] == "false"
    assert os.environ["WANDB_X_DISABLE_STATS"] == "false"
    assert os.environ["WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL"] == "0.25"


# --- the pod's check --------------------------------------------------------------------------


@pytest.fixture
def graphql_answer() -> Iterator[dict[str, Any]]:
    """A plain HTTP server on loopback, standing in for a W&B server's GraphQL endpoint."""
    with answering_server(200, b'{"data": {"viewer": {"id": "VXNlcjox"}}}') as state:
        yield state


def online(base_url: str | None = None) -> Any:
    extra = {"baseUrl": base_url} if base_url else {}
    return config(Path("/tmp"), mode="online", apiKeySecret={"name": "wandb", "key": "api-key"}, **extra).tracking.wandb


def test_the_check_asks_for_nothing_offline_and_refuses_an_online_run_without_its_key() -> None:
    assert preflight(config(Path("/tmp")).tracking.wandb, {}) == ([], [])
    assert preflight(online(), {ENV_WANDB_API_KEY: ""}) == (
        [
            "tracking.wandb.apiKeySecret: no W&B API key from the Secret 'wandb', key 'api-key' "
            "(the Secret or its key is missing or empty)"
        ],
        [],
    )


def test_the_check_sends_the_key_as_the_client_does_and_says_what_the_server_answered(
    graphql_answer: dict[str, Any],
) -> None:
    url = graphql_answer["url"]
    assert preflight(online(url), {ENV_WANDB_API_KEY: "k3y"}) == ([], [])
    path, auth, query = graphql_answer["seen"][-1]
    assert path == "/graphql" and auth == "Basic " + base64.b64encode(b"api:k3y").decode()
    assert "viewer" in json.loads(query)["query"]

    graphql_answer["status"], graphql_answer["body"] = 401, b'{"errors": [{"message": "user is not logged in"}]}'
    assert preflight(online(url), {ENV_WANDB_API_KEY: "k3y"}) == (
        [f"tracking.wandb: the W&B server {url} refused the API key from wandb (HTTP 401)"],
        [],
    )
    graphql_answer["status"], graphql_answer["body"] = 404, b"<html>not found</html>"
    assert preflight(online(url), {ENV_WANDB_API_KEY: "k3y"}) == (
        [f"tracking.wandb: the W&B server {url} does not answer as a W&B server (HTTP 404 from {url}/graphql)"],
        [],
    )
    # Rate-limited or down for now: a warning, and training starts (its points wait for nothing).
    graphql_answer["status"], graphql_answer["body"] = 429, b'{"errors": [{"message": "rate limited"}]}'
    assert preflight(online(url), {ENV_WANDB_API_KEY: "k3y"}) == (
        [],
        [
            f"tracking.wandb: the W&B server {url} answered HTTP 429 now: training starts, and its points are "
            "dropped (fsdp_tracker_points_dropped_total) until the server answers"
        ],
    )


def test_the_check_warns_of_a_server_that_does_not_answer_and_refuses_a_host_that_does_not_resolve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    errors, warnings = preflight(online(down), {ENV_WANDB_API_KEY: "k"})
    assert errors == [] and len(warnings) == 1
    assert warnings[0].startswith(f"tracking.wandb: the W&B server {down} does not answer now (")
    typo = "https://wandb.no-such-namespace.invalid"
    dns_answers(monkeypatch, socket.EAI_NONAME, "Name or service not known")
    assert preflight(online(typo), {ENV_WANDB_API_KEY: "k"}) == (
        [f"tracking.wandb: the W&B server {typo}: the host does not resolve (Name or service not known)"],
        [],
    )


def test_samples_are_a_table_in_the_steps_row(tmp_path: Path) -> None:
    tracker = WandbTracker.from_config(config(tmp_path))
    tracker.write(5, {"train/loss": 1.0})
    tracker.write_samples(5, [("2 + 2 =", "4"), ("Hello", "")])
    tracker.write(6, {"train/loss": 0.5})
    tracker.close()
    run_id = json.loads((tmp_path / "checkpoints" / WANDB_RUN_FILE).read_text())["run_id"]
    [path] = run_files(tmp_path / "checkpoints" / WANDB_SUBDIR, run_id)
    [row] = [r for r in history(path) if r["_step"] == 5]
    assert row["train/loss"] == 1.0
    assert (row["samples/_type"], row["samples/nrows"]) == ("table-file", 2)
    table = path.parent / "files" / row["samples/path"]
    assert json.loads(table.read_text())["data"] == [["2 + 2 =", "4"], ["Hello", ""]]
