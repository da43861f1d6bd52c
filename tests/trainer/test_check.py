"""``fsdp-train check``: the one-process config check the pods run before torchrun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fsdp_api.contract import CONFIG_ERROR_EXIT_CODE
from fsdp_api.launch import checked_launch, torchrun_standalone, trainer_program
from fsdp_api.ports import free_port
from fsdp_trainer.check import check, launch_shape, node_counts, processes_per_node
from fsdp_trainer.errors import ConfigError

from tests.trainer.harness import base_config, offline_env
from tests.trainer.tracking.mlflow_server import MlflowServer
from tests.trainer.tracking.stand_in import dns_answers


@pytest.fixture
def config_path(tmp_path: Path, inputs: dict[str, Path]) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])))
    return path


def _write(path: Path, **changes: object) -> Path:
    config = yaml.safe_load(path.read_text())
    config.update(changes)
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_good_config_passes_with_a_summary(config_path: Path) -> None:
    summary = check(str(config_path), "2", 3)
    assert summary.startswith("configuration ok: LlamaForCausalLM, ")
    assert summary.endswith("2 node(s) x 3 process(es)")


def test_every_world_size_an_elastic_job_may_reach_is_checked(config_path: Path) -> None:
    _write(config_path, fsdp={"shardingStrategy": "hybrid", "shardGroupSize": 4})
    assert check(str(config_path), "2", 2).endswith("2 node(s) x 2 process(es)")
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "2:4", 2)
    # 2 and 4 nodes give 4 and 8 ranks; 3 nodes give 6, which groups of 4 cannot divide.
    assert info.value.lines == [
        "fsdp.shardGroupSize: the world size 6 is not a multiple of the shard group size 4, "
        "so the hybrid mesh (replicate x shard) cannot be built (with 3 nodes)"
    ]


def test_a_malformed_fault_hook_is_one_config_line_before_any_rank(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It raised IndexError/ValueError in every rank at every step (issue 24)."""
    monkeypatch.setenv("FSDP_TRAINER_FAULT", "after_step")
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "1", 2)
    assert info.value.lines == [
        "FSDP_TRAINER_FAULT: 'after_step' is not <point>:<step>[:<rank>[:<action>]] with point after_step, "
        "during_save or during_upload, action kill, hang, sleep<seconds> or slow<seconds>"
    ]


def test_launch_arguments_are_read_as_torchrun_reads_them() -> None:
    assert node_counts("3") == [3]
    assert node_counts("2:4") == [2, 3, 4]
    for bad in ("0", "4:2", "two", ""):
        with pytest.raises(ConfigError, match="--nnodes: "):
            node_counts(bad)
    assert processes_per_node("8") == 8
    assert processes_per_node("cpu") >= 1
    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError, match="--nproc-per-node: "):
            processes_per_node(bad)
    # From the launch the check precedes, parsed by torchrun's own parser.
    program = ["-m", "fsdp_trainer", "--config", "x"]
    assert launch_shape(["torchrun", "--nnodes=2:4", "--nproc-per-node=8", "--rdzv-backend=c10d", *program]) == (
        "2:4",
        "8",
    )
    assert launch_shape(torchrun_standalone(3, program, python="/venv/bin/python")) == ("1:1", "3")
    assert launch_shape(["python", "train.py"]) == (None, None)


def _run(cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=offline_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow  # a fresh Python importing torch (over the unit tier's limit, tests/slow_guard.py)
def test_a_bad_config_stops_in_the_check_with_its_lines_and_never_launches(config_path: Path, tmp_path: Path) -> None:
    _write(config_path, data={"path": str(tmp_path / "nowhere" / "*.jsonl"), "tokenizer": str(tmp_path / "nope")})
    marker = tmp_path / "launched"
    launch = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
    proc = _run(checked_launch(config_path, launch, python=sys.executable), tmp_path)
    assert proc.returncode == CONFIG_ERROR_EXIT_CODE, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "fsdp-train: invalid trainer configuration:"
    assert lines[1].startswith("  data.path: no .json, .jsonl, .parquet, .txt files in ")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("suffix", "content", "docs", "unit"),
    [
        # 3 rows: one is held out for validation (at least one always is), 2 train.
        (".jsonl", "".join(json.dumps({"text": f"w{i} w{i + 1} " * 20}) + "\n" for i in range(3)), 3, "rows"),
        # Plain text: a document per paragraph, however many lines it has.
        (".txt", "w1 w2 w3\nw4 w5\n\nw6 w7 w8\n\n\nw9 w1 w2\n", 3, "paragraphs"),
    ],
)
def test_fewer_training_documents_than_data_parallel_ranks_is_one_line_in_the_check(
    config_path: Path, tmp_path: Path, suffix: str, content: str, docs: int, unit: str
) -> None:
    """Before: the check passed, then each rank left without documents stopped with a traceback."""
    data = tmp_path / f"few{suffix}"
    data.write_text(content)
    config = yaml.safe_load(config_path.read_text())
    _write(config_path, data={**config["data"], "path": str(data)})
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "1", 3)  # 3 ranks, 2 training documents
    assert info.value.lines == [
        f"data.path: {data}: 2 training documents ({docs} {unit}, 1 held out for validation) for 3 data-parallel "
        "ranks: each rank needs at least one; add documents or train on fewer ranks"
    ]
    assert check(str(config_path), "1", 2).startswith("configuration ok")  # 2 ranks, one document each


def test_a_preference_file_with_an_empty_answer_stops_in_the_check_naming_the_row(
    config_path: Path, tmp_path: Path
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "w1 w2", "chosen": "w3", "rejected": "w4"}] * 3 + [
        {"prompt": "w1", "chosen": "w3", "rejected": ""}
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = yaml.safe_load(config_path.read_text())
    _write(
        config_path,
        data={**config["data"], "path": str(pairs), "format": "preference"},
        training={**config["training"], "objective": "dpo"},
    )
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "1", 2)
    assert info.value.lines == [
        f"data.path: {pairs}: {pairs} line 4: field 'rejected' is empty: a pair needs two answers to compare"
    ]
    # The objective and the format go together in the trainer's own config too (fsdp-train run on its own).
    _write(
        config_path, data={**config["data"], "path": str(pairs), "format": "preference"}, training=config["training"]
    )
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "1", 2)
    assert info.value.lines == [
        "data.format: preference rows hold pairs to compare: set training.objective dpo or simpo"
    ]


@pytest.mark.slow  # a fresh Python importing torch (over the unit tier's limit, tests/slow_guard.py)
def test_a_good_config_is_replaced_by_the_launch_command(config_path: Path, tmp_path: Path) -> None:
    # exec, not a child: the launch keeps the check's process id (PID 1 in a container).
    launch = [sys.executable, "-c", "import os, sys; print(os.getpid()); sys.exit(7)"]
    probe = [sys.executable, "-c", "import os, sys; print(os.getpid()); os.execv(sys.argv[1], sys.argv[1:])"]
    cmd = checked_launch(config_path, launch, python=sys.executable)
    proc = _run([*probe, *cmd], tmp_path)
    assert proc.returncode == 7, proc.stderr[-2000:]
    before, after = proc.stdout.split()
    assert before == after
    assert "fsdp-train: configuration ok: LlamaForCausalLM" in proc.stderr


@pytest.mark.slow
def test_torchrun_after_a_failed_check_never_starts(config_path: Path, tmp_path: Path) -> None:
    """The launch the pods and run-local use: a bad config is one error block, not a rank traceback."""
    _write(config_path, fsdp={"shardingStrategy": "hybrid", "shardGroupSize": 3})
    launch = torchrun_standalone(2, trainer_program(config_path))
    proc = _run(checked_launch(config_path, launch, python=launch[0]), tmp_path)
    assert proc.returncode == CONFIG_ERROR_EXIT_CODE
    assert "shard group of 3 ranks is larger than the world size 2" in proc.stderr
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr


@pytest.mark.slow  # a fresh Python importing torch (over the unit tier's limit, tests/slow_guard.py)
def test_sigterm_during_the_check_stops_pid_1_before_torchrun(tmp_path: Path) -> None:
    """In a container the check is PID 1, which has no default action for SIGTERM: it must handle it.

    Without a handler the kubelet's SIGTERM was dropped, torchrun started anyway
    and the pod trained until its grace period ended in SIGKILL (a real kubelet
    showed it, tests/images/test_kubelet.py).
    """
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare: a PID namespace makes the check PID 1, as in a container")
    # The config is a FIFO: the check blocks reading it, so the signal comes mid-check, deterministically.
    config = tmp_path / "train.yaml"
    os.mkfifo(config)
    marker = tmp_path / "launched"
    launch = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *checked_launch(config, launch, python=sys.executable)],
        stderr=subprocess.PIPE,
        text=True,
        env=offline_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while (writer := _open_writer(config)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the check never opened its config"
            time.sleep(0.05)
        (check_pid,) = (int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())
        os.kill(check_pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # The check has two threads by now (torch's import starts one); when the kernel hands the
            # signal to the other one, the main thread stays blocked in read() on the FIFO (a regular
            # file never blocks so) and runs the handler once the read returns: end it with EOF.
            os.close(writer)
            code = proc.wait(timeout=30)
        else:
            os.close(writer)
    finally:
        proc.kill()
    assert code == 128 + signal.SIGTERM
    assert "fsdp-train: SIGTERM during the config check, before torchrun started: nothing to save; exit 143" in (
        proc.stderr.read() if proc.stderr else ""
    )
    assert not marker.exists()


def _open_writer(fifo: Path) -> int | None:
    """The FIFO's write end once a reader has it open (ENXIO before)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


def test_an_mlflow_server_is_asked_once_before_the_launch(
    config_path: Path, capsys: pytest.CaptureFixture[str], mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong tracker address is one line before torchrun; a server that is down only a warning."""
    _write(config_path, tracking={"mlflow": {"uri": mlflow_server.uri, "experiment": "checked"}})
    assert check(str(config_path), "1", 2).startswith("configuration ok: ")
    assert "warning" not in capsys.readouterr().err

    down = f"http://127.0.0.1:{free_port()}"
    _write(config_path, tracking={"mlflow": {"uri": down, "experiment": "checked"}})
    assert check(str(config_path), "1", 2).startswith("configuration ok: ")
    assert capsys.readouterr().err.startswith(f"fsdp-train: warning: tracking.mlflow.uri {down} does not answer now")

    dns_answers(monkeypatch, socket.EAI_NONAME, "Name or service not known")  # whatever resolver CI has
    _write(config_path, tracking={"mlflow": {"uri": "http://mlflow.typo.invalid:5000", "experiment": "checked"}})
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "1", 2)
    [line] = info.value.lines
    assert line.startswith("tracking.mlflow.uri http://mlflow.typo.invalid:5000: the host does not resolve (")


def test_an_online_wandb_run_without_its_key_is_one_line_before_the_launch(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renderer makes the key's Secret optional, so a missing Secret reaches this check as an empty key."""
    online = {"project": "llama", "apiKeySecret": {"name": "wandb", "key": "api-key"}}
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    _write(config_path, tracking={"wandb": online})
    with pytest.raises(ConfigError) as info:
        check(str(config_path), "1", 2)
    assert info.value.lines == [
        "tracking.wandb.apiKeySecret: no W&B API key from the Secret 'wandb', key 'api-key' "
        "(the Secret or its key is missing or empty)"
    ]
    _write(config_path, tracking={"wandb": {"project": "llama", "mode": "offline"}})
    assert check(str(config_path), "1", 2).startswith("configuration ok: ")
