"""run_local: the embedded default trains, checkpoints and resumes on the CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from fsdp_api import FSDPTraining
from fsdp_api.documents import InputError, load_one
from fsdp_operator.local import local_config, run_local, run_lock
from fsdp_operator.render import render
from fsdp_trainer.checkpoint import latest_checkpoint

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "fsdptraining-tiny.yaml"
STEP_LINE = re.compile(r"^step (\d+)/(\d+) \| loss ([\d.]+)", re.MULTILINE)


def example_copy(tmp_path: Path, **checkpoint: int) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["checkpoint"].update(checkpoint)
    # Validation and the example's micro-batch of 8 cost time this test needs
    # not spend: half the batch still learns clearly within 30 steps.
    doc["spec"]["training"]["evalIntervalSteps"] = 0
    doc["spec"]["training"]["microBatchSize"] = 4
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_train_yaml_is_the_operators_configmap_with_local_paths(tmp_path: Path) -> None:
    training = load_one(EXAMPLE)
    cfg = local_config(training, tmp_path / "out", steps=20)
    configmap = next(o for o in render(training) if o["kind"] == "ConfigMap")
    rendered = yaml.safe_load(configmap["data"]["train.yaml"])
    local = cfg.to_dict()
    assert local["checkpoint"].pop("dir") == str((tmp_path / "out" / "checkpoints").resolve())
    assert local["training"].pop("maxSteps") == 20
    rendered["checkpoint"].pop("dir")
    rendered["training"].pop("maxSteps")
    local["metrics"].pop("port")  # a free port if the spec's is taken
    rendered["metrics"].pop("port")
    assert local == rendered


def test_short_step_override_keeps_warmup_below_max_steps(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["training"]["warmupSteps"] = 50
    cfg = local_config(FSDPTraining.model_validate(doc), tmp_path, steps=20)
    assert cfg.training.max_steps == 20
    assert cfg.training.warmup_steps == 2


def test_invalid_spec_is_reported_with_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["training"]["seqLen"] = 4096  # beyond tiny's maxSeqLen 1024
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"training.seqLen must not exceed the model's maxSeqLen"):
        run_local(bad, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # run-local's own processes (over the unit tier's limit, tests/slow_guard.py)
def test_a_config_only_the_trainer_can_check_is_one_error_not_a_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The spec is valid; its data path is not there, which only the trainer can see.
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["data"] = {"path": str(tmp_path / "nowhere" / "*.jsonl")}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert run_local(bad, nproc=2, output_dir=tmp_path / "out", steps=1) == 2
    err = capfd.readouterr().err
    assert "fsdp-train: invalid trainer configuration:\n  data.path: no .json, .jsonl, .parquet, .txt files in" in err
    assert "Traceback" not in err and "ChildFailedError" not in err, err


@pytest.mark.slow
def test_trains_checkpoints_and_resumes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    spec = example_copy(tmp_path, intervalSteps=10)
    out = tmp_path / "run"

    assert run_local(spec, nproc=2, output_dir=out, steps=30) == 0
    first = capfd.readouterr()
    steps = [(int(s), float(loss)) for s, _, loss in STEP_LINE.findall(first.out)]
    assert steps[0][0] == 1 and steps[-1][0] == 30, first.out
    start_loss, end_loss = steps[0][1], steps[-1][1]
    # Random init starts near ln(vocab) = 8.3; 30 steps at lr 1e-3 learn well below it.
    assert start_loss > 7.5
    assert end_loss < start_loss - 1.0, steps
    # The URL run-local prints is the one rank 0 serves once it is up, and it says it is not up yet.
    (port,) = re.findall(r"run-local: metrics at http://127.0.0.1:(\d+)/metrics once rank 0 says", first.out)
    assert f"metrics: serving http://127.0.0.1:{port}/metrics" in first.out + first.err
    latest = latest_checkpoint(out / "checkpoints")
    assert latest is not None and latest[0] == 30
    # The last line names the checkpoint and what to do with it.
    assert first.out.splitlines()[-1] == (
        f"run-local: tiny: done at step 30: checkpoint {latest[1]}; as a Hugging Face model: "
        f"fsdp-train export --checkpoint {out / 'checkpoints'} --output {out / 'hf-model'}"
    )

    # Same output dir, more steps: resumes from step 30 instead of starting over.
    assert run_local(spec, nproc=2, output_dir=out, steps=40) == 0
    second = capfd.readouterr()
    assert "(resuming from them)" in second.out
    assert re.search(r"resumed from .*step-0*30 at step 30", second.err), second.err
    resumed = [(int(s), int(m), float(loss)) for s, m, loss in STEP_LINE.findall(second.out)]
    assert resumed[0][:2] == (31, 40), second.out
    assert resumed[-1][:2] == (40, 40)
    assert all(step > 30 for step, _, _ in resumed)
    # The resumed model continues from the trained weights, not from scratch.
    assert resumed[0][2] < start_loss - 1.0
    latest = latest_checkpoint(out / "checkpoints")
    assert latest is not None and latest[0] == 40


def _with_env(tmp_path: Path, env: list[dict], **spec: object) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["env"] = env
    doc["spec"].update(spec)
    path = tmp_path / "with-env.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_spec_env_reaches_a_local_run_literal_values_as_written_and_the_clusters_from_the_shell(
    tmp_path: Path,
) -> None:
    from fsdp_operator.local import local_spec_env

    secret = {"valueFrom": {"secretKeyRef": {"name": "aws", "key": "id"}}}
    env = [
        {"name": "AWS_ENDPOINT_URL_S3", "value": "http://127.0.0.1:9000"},
        {"name": "AWS_ACCESS_KEY_ID", **secret},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ]
    training = load_one(_with_env(tmp_path, env))
    # The spec's literal wins over the shell's, as in the pod.
    shell = {"AWS_ENDPOINT_URL_S3": "https://s3.amazonaws.com", "AWS_ACCESS_KEY_ID": "from-shell"}
    got, notes = local_spec_env(training, shell)
    assert got == {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "from-shell"}
    assert notes == [
        "AWS_ENDPOINT_URL_S3 as the spec sets it",
        "AWS_ACCESS_KEY_ID (valueFrom in the cluster) from this shell",
        "HF_TOKEN (valueFrom in the cluster) not in this shell: unset; export it to pass it",
    ]


@pytest.mark.slow  # run-local's own processes (over the unit tier's limit, tests/slow_guard.py)
def test_a_local_run_asks_the_s3_endpoint_its_spec_env_names(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/s3-checkpoints.md's S3-compatible store, locally: the check asks the spec's endpoint, not AWS."""
    from fsdp_api.ports import free_port

    closed = free_port()  # nothing listens: the check's probe fails there, naming it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local-secret")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    secret = {"secretKeyRef": {"name": "s3", "key": "id"}}
    env = [
        {"name": "AWS_ENDPOINT_URL_S3", "value": f"http://127.0.0.1:{closed}"},
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": secret},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": secret},
        {"name": "AWS_MAX_ATTEMPTS", "value": "1"},
    ]
    doc = yaml.safe_load(_with_env(tmp_path, env).read_text())
    doc["spec"]["checkpoint"]["remote"] = "s3://local-ckpt/tiny"
    spec = tmp_path / "remote.yaml"
    spec.write_text(yaml.safe_dump(doc))
    assert run_local(spec, nproc=1, output_dir=tmp_path / "out", steps=1) == 2
    out, err = capfd.readouterr()
    assert "run-local: spec.env: AWS_ENDPOINT_URL_S3, AWS_MAX_ATTEMPTS as the spec sets them" in out
    assert f"http://127.0.0.1:{closed}/local-ckpt" in err, err
    assert "amazonaws.com" not in err and "Traceback" not in err, err


def test_a_second_run_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    with run_lock(out):
        message = rf"{re.escape(str(out))} is in use by another run-local \(pid {os.getpid()}\)"
        with pytest.raises(InputError, match=message):
            run_local(EXAMPLE, output_dir=out, steps=1)
    # Released with the holder: the directory is usable again.
    with run_lock(out):
        pass


def test_an_unusable_output_dir_or_step_count_is_one_error(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(InputError, match=r"--output-dir .*a-file: cannot create it: File exists"):
        run_local(EXAMPLE, output_dir=a_file, steps=1)
    with pytest.raises(InputError, match=r"training.maxSteps: Input should be less than or equal to 100000000"):
        run_local(EXAMPLE, output_dir=tmp_path / "run", steps=1_000_000_000)


def test_a_script_of_your_own_is_one_line_pointing_at_torchrun(tmp_path: Path) -> None:
    script_job = REPO / "examples" / "your-own-script" / "fsdptraining.yaml"
    with pytest.raises(InputError, match=r"^t5-finetune: spec.command runs your own script, .*torchrun --standalone"):
        run_local(script_job, output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (torchrun and its ranks name the run's train.yaml)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry.name))
    return found


def _training_run_local(tmp_path: Path, out: Path) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """A run-local of (nearly) endless steps, returned once it has printed its first step line."""
    spec = example_copy(tmp_path, intervalSteps=100000)
    cmd = [sys.executable, "-m", "fsdp_operator.cli", "run-local", "-f", str(spec), "--output-dir", str(out)]
    proc = subprocess.Popen([*cmd, "--steps", "100000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + 240
    while not any(STEP_LINE.match(line) for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("".join(lines)[-4000:])
        time.sleep(0.2)
    return proc, lines, reader


@pytest.mark.slow
def test_sigterm_stops_every_rank_after_a_checkpoint(tmp_path: Path) -> None:
    """SIGTERM to run-local reaches torchrun and both ranks: they save, exit, and nothing is left running."""
    out = tmp_path / "run"
    config = str(out / "train.yaml")
    proc, lines, reader = _training_run_local(tmp_path, out)
    try:
        proc.send_signal(signal.SIGTERM)  # to run-local only, as `kill PID` would
        assert proc.wait(timeout=180) == 128 + signal.SIGTERM
        reader.join(timeout=10)
        output = "".join(lines)
        assert "stopped on SIGTERM after step" in output, output[-4000:]
        latest = latest_checkpoint(out / "checkpoints")
        assert latest is not None and latest[0] >= 1
        assert _processes_mentioning(config) == [], output[-4000:]
    finally:
        for pid in _processes_mentioning(config):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_kill_9_of_run_local_stops_the_ranks_and_keeps_the_directory_locked_until_they_are_gone(
    tmp_path: Path,
) -> None:
    """SIGKILL cannot be caught (issue 24, 10): before, the ranks trained on unseen and the lock died with
    run-local, so a second run-local trained beside them. Now the launch gets SIGTERM when run-local dies
    (the ranks save and exit) and holds the directory's lock until it has."""
    out = tmp_path / "run"
    config = str(out / "train.yaml")
    proc, lines, reader = _training_run_local(tmp_path, out)
    try:
        proc.kill()
        proc.wait(timeout=10)
        refusals, deadline = 0, time.monotonic() + 180
        while _processes_mentioning(config):
            assert time.monotonic() < deadline, "the ranks outlived run-local:\n" + "".join(lines)[-4000:]
            try:
                with run_lock(out):
                    alive = _processes_mentioning(config)  # (they may have ended just before the lock was taken)
                    assert not alive, f"the directory was free while {alive} ran"
            except InputError as e:
                assert "is in use by another run-local" in str(e)
                refusals += 1
            time.sleep(0.2)
        reader.join(timeout=30)  # the ranks held run-local's stdout: it ends with them
        output = "".join(lines)
        assert refusals >= 1, output[-4000:]
        assert "stopped on SIGTERM after step" in output, output[-4000:]
        latest = latest_checkpoint(out / "checkpoints")
        assert latest is not None and latest[0] >= 1
        with run_lock(out):  # free once they are gone
            pass
    finally:
        for pid in _processes_mentioning(config):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # run-local's own processes (over the unit tier's limit, tests/slow_guard.py)
def test_a_pretrained_qwen2_directory_fine_tunes_end_to_end(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Not a Llama: a tiny Qwen2 checkpoint (q/k/v biases, tied) with its tokenizer, as a user would bring it."""
    from tests.trainer.harness import build_word_tokenizer, write_ragged_jsonl
    from tests.trainer.model.architectures import build_checkpoint

    model = build_checkpoint("qwen2", tmp_path / "qwen2", build_word_tokenizer(tmp_path / "tokenizer"))
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"] = {"pretrained": str(model)}
    doc["spec"]["data"] = {"path": str(write_ragged_jsonl(tmp_path / "docs.jsonl", 200))}
    doc["spec"]["training"].update(evalIntervalSteps=0, microBatchSize=2, seqLen=32, logIntervalSteps=1)
    spec = tmp_path / "qwen2.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert run_local(spec, nproc=2, output_dir=out, steps=6) == 0
    captured = capfd.readouterr()
    text = captured.out + captured.err
    losses = [float(m.group(3)) for m in STEP_LINE.finditer(text)]
    assert len(losses) == 6, text[-3000:]
    assert latest_checkpoint(out / "checkpoints")[0] == 6
    saved = latest_checkpoint(out / "checkpoints")[1] / "model_config" / "config.json"
    assert json.loads(saved.read_text())["model_type"] == "qwen2"


def test_a_finished_run_started_again_says_there_is_nothing_to_train_and_starts_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before, the trainer resumed at 300/300 and ended without a word."""
    out = tmp_path / "run"
    step = out / "checkpoints" / "step-00000300"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("{}")
    assert run_local(example_copy(tmp_path), nproc=2, output_dir=out) == 0
    captured = capfd.readouterr()
    assert "configuration ok" not in captured.out + captured.err  # no check, no torchrun, no ranks
    said = captured.out.splitlines()
    # The spec's cluster job is one process; run-local starts two, and says whose setting that is.
    assert said[0] == "run-local: tiny: 2 CPU ranks (gloo; --nproc, where the cluster runs 1), 300 steps"
    assert said[-1] == (
        f"run-local: tiny: nothing to train: the newest checkpoint in {out / 'checkpoints'} is step 300, and "
        "maxSteps is 300; --steps N (above 300) trains on from it, another --output-dir starts over"
    )


def test_a_context_split_wider_than_the_local_ranks_names_the_nproc_that_fits(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["parallelism"] = {"context": 4}
    doc["spec"]["resources"]["nodes"] = 4  # four CPU pods in the cluster: valid there
    path = tmp_path / "cp4.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as refused:
        run_local(path, nproc=2, output_dir=tmp_path / "out")
    assert str(refused.value) == (
        "the world size 2 is not a multiple of pipeline x tp x cp = 1 x 1 x 4, so the data-parallel size is not a "
        "whole number; run-local: --nproc 4 (a multiple of pipeline x tp x cp = 1 x 1 x 4)"
    )
