"""checkpoint.remote against a real S3 server (versitygw on loopback) and the real boto3 client.

One server for the module; each test uses its own bucket or prefix.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api.contract import ENV_SHUTDOWN_TIMEOUT, ENV_TRAINER_FAULT
from fsdp_api.launch import trainer_program
from fsdp_api.ports import free_port
from fsdp_localcluster.s3 import S3Server
from fsdp_trainer.check import check
from fsdp_trainer.checkpoint import complete_checkpoints
from fsdp_trainer.checkpoint.remote_store import MANIFEST
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.trace import read_trace

from tests.trainer.harness import base_config, kill_tree, launch, offline_env
from tests.trainer.tracking.stand_in import answering_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    try:
        yield server
    finally:
        server.stop()


def committed(server: S3Server, bucket: str, prefix: str) -> list[int]:
    """Steps under s3://bucket/prefix whose manifest is written."""
    return sorted(int(k.split("/")[-2].split("-")[1]) for k in server.keys(bucket, prefix) if k.endswith(MANIFEST))


def remote_config(work: Path, inputs: dict[str, Path], remote: str, **training: Any) -> dict[str, Any]:
    return base_config(
        work,
        inputs["ragged"],
        inputs["tokenizer"],
        # A flat learning rate after warm-up: a run cut at step 4 follows the same schedule as one of 8 steps.
        training={"maxSteps": 8, "minLearningRateRatio": 1.0, **training},
        checkpoint={"intervalSteps": 4, "keepLast": 1, "remote": remote, "remoteKeepLast": 2},
    )


def test_a_step_in_s3_resumes_exactly_when_the_local_directory_is_lost(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.create_bucket("resume")
    env = s3.env()
    straight = launch(
        tmp_path / "straight", remote_config(tmp_path / "straight", inputs, "s3://resume/straight"), env=env
    )
    straight.check()
    assert committed(s3, "resume", "straight/") == [4, 8]

    work = tmp_path / "cut"
    cfg = remote_config(work, inputs, "s3://resume/cut", maxSteps=4)
    launch(work, cfg, env=env).check()
    assert committed(s3, "resume", "cut/") == [4]
    shutil.rmtree(work / "checkpoints")  # an emptyDir gone with its pod
    cfg["training"]["maxSteps"] = 8
    resumed = launch(work, cfg, env=env).check()
    assert resumed.events("start")[-1]["step"] == 4
    assert "downloaded step 4 from s3://resume/cut" in resumed.output
    after = {s: loss for s, loss in resumed.losses().items() if s > 4}
    assert after == {s: straight.losses()[s] for s in (5, 6, 7, 8)}, "bit-identical to the uninterrupted run"
    assert committed(s3, "resume", "cut/") == [4, 8]

    # On one rank: DCP reshards the two ranks' shards; the data moves to a fresh epoch, as a local resume does.
    shutil.rmtree(tmp_path / "straight" / "checkpoints")
    one_cfg = remote_config(tmp_path / "straight", inputs, "s3://resume/straight", maxSteps=10)
    one = launch(tmp_path / "straight", one_cfg, nproc=None, env=env).check()
    start = one.events("start")[-1]
    assert (start["step"], start["world_size"]) == (8, 1)
    assert one.losses()[9] < straight.losses()[1] - 0.1, "the trained weights came back from S3"
    # remoteKeepLast 2: steps 4 and 8 of two ranks gave way to 8 and 10.
    assert committed(s3, "resume", "straight/") == [8, 10]

    # The export reads the remote tier too (an emptyDir training's only copy): the newest committed
    # step, checked against its manifest, gives the same model as the local copy of that step.
    from fsdp_trainer.export import main as export_main
    from safetensors.torch import load_file

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert export_main(["--checkpoint", "s3://resume/straight", "--output", str(tmp_path / "from-s3")]) == 0
    assert (
        export_main(["--checkpoint", str(tmp_path / "straight" / "checkpoints"), "--output", str(tmp_path / "here")])
        == 0
    )
    ours, theirs = (load_file(tmp_path / d / "model.safetensors") for d in ("from-s3", "here"))
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
    assert export_main(["--checkpoint", "s3://resume/straight/step-00000008", "--output", str(tmp_path / "s8")]) == 0
    for uri, said in (
        (
            "s3://resume/straight/step-00000004",
            "--checkpoint: s3://resume/straight/step-00000004 is not a committed step",
        ),
        ("s3://resume/nothing", "--checkpoint: no committed step under s3://resume/nothing"),
    ):
        with pytest.raises(ConfigError) as refused:
            export_main(["--checkpoint", uri, "--output", str(tmp_path / "never")])
        assert refused.value.lines[0].startswith(said), refused.value.lines
    assert not (tmp_path / "never").exists()


def test_an_upload_cut_short_is_never_resumed_and_is_removed(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server
) -> None:
    s3.create_bucket("cutshort")
    work = tmp_path / "run"
    cfg = remote_config(work, inputs, "s3://cutshort/run", maxSteps=4)
    # Step 4 committed first: a run ends only once its last step is in S3 (in one run with the crash,
    # a rank still uploading step 4 when step 8 is queued would skip it for the newer one).
    launch(work, cfg, env=s3.env()).check()
    assert committed(s3, "cutshort", "run/") == [4]
    cfg["training"]["maxSteps"] = 8
    # Rank 1 dies after sending its files of step 8, before its part list: step 8 never gets a manifest.
    # torchrun then stops rank 0, which was waiting for that part; its wait ends within the shutdown timeout.
    fault = {ENV_TRAINER_FAULT: "during_upload:8:1", ENV_SHUTDOWN_TIMEOUT: "6"}
    t0 = time.monotonic()
    crashed = launch(work, cfg, env={**s3.env(), **fault})
    # Unheeded, the wait would last checkpoint.remoteWaitSeconds (600 s by default). The bound is far
    # from that and from the launch's own cost on a busy machine (30 s at a load of 5, where 25 s failed).
    assert time.monotonic() - t0 < 150, "rank 0's wait for the uploads heeded SIGTERM"
    assert crashed.returncode != 0
    keys = s3.keys("cutshort", "run/step-00000008/")
    assert keys and not any(k.endswith(MANIFEST) for k in keys), keys
    assert committed(s3, "cutshort", "run/") == [4]

    shutil.rmtree(work / "checkpoints")  # only the remote tier is left: its step 8 is not complete
    resumed = launch(work, cfg, env=s3.env()).check()
    assert resumed.events("start")[-1]["step"] == 4
    assert "removed uncommitted remote checkpoint s3://cutshort/run/step-00000008" in resumed.output
    assert committed(s3, "cutshort", "run/") == [4, 8]
    manifest = json.loads(s3.client().get_object(Bucket="cutshort", Key=f"run/step-00000008/{MANIFEST}")["Body"].read())
    assert manifest["world_size"] == 2
    assert {o["key"] for o in manifest["objects"]} >= {".metadata", "__0_0.distcp", "__1_0.distcp", "COMPLETE"}


def test_uploads_catch_up_when_the_server_comes_back(tmp_path: Path, inputs: dict[str, Path]) -> None:
    """The server down for a while: the steps go on, the uploads are retried and nothing is lost."""
    server = S3Server(tmp_path / "s3").start()
    try:
        server.create_bucket("outage")
        work = tmp_path / "run"
        cfg = remote_config(work, inputs, "s3://outage/run", maxSteps=30)
        cfg["checkpoint"].update(intervalSteps=2, keepLast=2)
        trace = work / "trace" / "trace-rank0.jsonl"
        seen: dict[str, int] = {}

        def outage() -> None:
            def reached(step: int) -> bool:
                return trace.exists() and any(r["event"] == "step" and r["step"] >= step for r in read_trace(trace))

            deadline = time.monotonic() + 240
            while not reached(4) and time.monotonic() < deadline:
                time.sleep(0.05)
            server.stop()
            while not reached(16) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["steps while down"] = max(r["step"] for r in read_trace(trace) if r["event"] == "step")
            server.start()

        watcher = threading.Thread(target=outage)
        watcher.start()
        # A slow rank 0 (0.3 s a step) keeps the run going while the server is away.
        run = launch(work, cfg, env={**server.env(), ENV_TRAINER_FAULT: "after_step:1:0:slow0.3"})
        watcher.join()
        run.check()
        assert seen["steps while down"] >= 16
        assert sorted(run.losses()) == list(range(1, 31)), "no step waited for S3"
        assert "failed (retrying in" in run.output
        assert [s for s, _ in complete_checkpoints(work / "checkpoints")] == [28, 30]
        # The training waited at its end until its last step was committed remotely.
        assert committed(server, "outage", "run/") == [28, 30]
    finally:
        server.stop()


def test_a_run_whose_last_step_is_not_in_s3_fails_and_its_restart_uploads_it(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    server = S3Server(tmp_path / "s3").start()
    try:
        server.create_bucket("final")
        work = tmp_path / "run"
        cfg = remote_config(work, inputs, "s3://final/run", maxSteps=4)
        cfg["checkpoint"].update(intervalSteps=2, remoteWaitSeconds=3)
        trace = work / "trace" / "trace-rank0.jsonl"

        def stop_when_training() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if trace.exists() and any(r["event"] == "step" for r in read_trace(trace)):
                    server.stop()
                    return
                time.sleep(0.02)

        watcher = threading.Thread(target=stop_when_training)
        watcher.start()
        # A slow rank 0 (0.5 s a step): the server is gone before the first save.
        failed = launch(work, cfg, env={**server.env(), ENV_TRAINER_FAULT: "after_step:1:0:slow0.5"})
        watcher.join()
        assert failed.returncode != 0
        assert (
            "fsdp-train: checkpoint.remote: the final checkpoint (step 4) was not committed to s3://final/run within "
            "checkpoint.remoteWaitSeconds (3 s; the rank logs say why); the local tier has it, and a restart uploads it"
        ) in failed.output
        assert [s for s, _ in complete_checkpoints(work / "checkpoints")][-1] == 4

        server.start()
        assert committed(server, "final", "run/") == []
        restarted = launch(work, cfg, env=server.env()).check()
        assert "step 4 is not committed to s3://final/run yet: uploading it" in restarted.output
        assert restarted.events("start")[-1]["step"] == 4 and not restarted.losses().keys() - {1, 2, 3, 4}
        assert committed(server, "final", "run/") == [4]
    finally:
        server.stop()


def test_check_warns_of_a_store_that_cannot_serve_now_and_starts_the_training(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """HTTP 503 SlowDown after botocore's retries: the store may be back before the first upload, which retries."""
    slow_down = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    with answering_server(503, slow_down) as answer:
        for name, value in (s3.env() | {"AWS_ENDPOINT_URL_S3": answer["url"]}).items():
            monkeypatch.setenv(name, value)
        cfg = remote_config(tmp_path, inputs, "s3://busy/run")
        (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
        assert check(str(tmp_path / "train.yaml"), "1", 2).startswith("configuration ok")
    warned = [line for line in capsys.readouterr().err.splitlines() if "checkpoint.remote" in line]
    assert warned == [
        "fsdp-train: warning: checkpoint.remote: s3://busy/run: ListObjectsV2: SlowDown (Please reduce your request "
        "rate.) now: training starts, and its uploads retry"
    ]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong-secret", "checkpoint.remote: s3://probe/run: ListObjects"),
        ("missing-bucket", "checkpoint.remote: s3://no-such-bucket/run: ListObjects"),
        ("read-only", "checkpoint.remote: s3://probe/run/.fsdp-probe-"),
    ],
)
def test_check_refuses_a_remote_it_cannot_use_in_one_line(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server, monkeypatch: pytest.MonkeyPatch, case: str, expected: str
) -> None:
    if "probe" not in {b["Name"] for b in s3.client().list_buckets()["Buckets"]}:
        s3.create_bucket("probe")
        s3.create_user("reader", "reader-secret")
        # The reader may list and read the bucket, not write to it.
        read_only = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": ["reader"]},
                    "Action": ["s3:ListBucket", "s3:GetObject"],
                    "Resource": ["arn:aws:s3:::probe", "arn:aws:s3:::probe/*"],
                }
            ],
        }
        s3.client().put_bucket_policy(Bucket="probe", Policy=json.dumps(read_only))
    env = {
        "wrong-secret": s3.env(secret_key="not-the-secret"),
        "missing-bucket": s3.env(),
        "read-only": s3.env("reader", "reader-secret"),
    }[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = "no-such-bucket" if case == "missing-bucket" else "probe"
    cfg = remote_config(tmp_path, inputs, f"s3://{bucket}/run")
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as refused:
        check(str(tmp_path / "train.yaml"), "1", 2)
    (line,) = refused.value.lines
    assert line.startswith(expected), line
    code = {"wrong-secret": "SignatureDoesNotMatch", "missing-bucket": "NoSuchBucket", "read-only": "AccessDenied"}
    assert code[case] in line and "\n" not in line

    # With the root account, the same check passes and leaves no probe object behind.
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    if case == "read-only":
        assert check(str(tmp_path / "train.yaml"), "1", 2).startswith("configuration ok")
        assert not [k for k in s3.keys("probe") if ".fsdp-probe-" in k]


def test_a_prefix_holding_another_trainings_steps_is_refused_naming_checkpoint_remote_and_nothing_is_deleted(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsdp_api.trainer_config import JobInfo, TrainerConfig
    from fsdp_trainer.checkpoint.remote_store import clean_remote

    s3.create_bucket("shared")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    cfg = remote_config(tmp_path, inputs, "s3://shared/run")
    other = TrainerConfig.model_validate({**cfg, "job": {**cfg.get("job", {}), "name": "other-training"}})
    client = s3.client()
    # The other training's committed step 4, and its step 8 still uploading (no manifest yet).
    client.put_object(Bucket="shared", Key="run/step-00000004/trainer_config.yaml", Body=other.to_yaml().encode())
    client.put_object(Bucket="shared", Key=f"run/step-00000004/{MANIFEST}", Body=b'{"objects": []}')
    client.put_object(Bucket="shared", Key="run/step-00000008/__0_0.distcp", Body=b"in flight")
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    me = TrainerConfig.model_validate(cfg).job

    with pytest.raises(ConfigError) as refused:
        check(str(tmp_path / "train.yaml"), "1", 2)
    (line,) = refused.value.lines
    assert line == (
        f"checkpoint.remote: s3://shared/run holds the checkpoints of training {me.namespace}/other-training "
        f"(newest committed step 4); this is {me.namespace}/{me.name}. Two trainings on one prefix resume from "
        "and prune each other's steps: give each its own checkpoint.remote"
    )
    # Rank 0's start-up cleaning refuses alike, before deleting the other's upload in flight.
    assert clean_remote("s3://shared/run", "auto", me) == line.removeprefix("checkpoint.remote: ")
    assert "run/step-00000008/__0_0.distcp" in s3.keys("shared", "run/")
    # The owner itself cleans as before.
    assert clean_remote("s3://shared/run", "auto", JobInfo(namespace=me.namespace, name="other-training")) is None
    assert s3.keys("shared", "run/step-00000008/") == []


def test_a_damaged_newest_remote_step_falls_back_to_the_local_tiers_older_one_instead_of_looping(
    tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import hashlib

    from fsdp_trainer.checkpoint.layout import MARKER
    from fsdp_trainer.checkpoint.remote_store import UnusableStep, fetch_newer

    s3.create_bucket("damaged")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    client = s3.client()
    good = b"shard bytes"
    manifest = {"objects": [{"key": "__0_0.distcp", "size": len(good), "sha256": hashlib.sha256(good).hexdigest()}]}
    client.put_object(Bucket="damaged", Key="run/step-00000008/__0_0.distcp", Body=b"shard bytez")  # bit rot
    client.put_object(Bucket="damaged", Key=f"run/step-00000008/{MANIFEST}", Body=json.dumps(manifest).encode())

    # Nothing local: a fresh start would train over the steps in S3, so the damage stays an error.
    with pytest.raises(UnusableStep, match="the remote copy of step 8 is damaged"):
        fetch_newer("s3://damaged/run", tmp_path / "empty")
    # A good older step in the local tier: resumed from instead (before: the same error on every restart).
    local = tmp_path / "ckpt" / "step-00000004"
    local.mkdir(parents=True)
    (local / MARKER).write_text("")
    with caplog.at_level("WARNING"):
        assert fetch_newer("s3://damaged/run", tmp_path / "ckpt") is None
    assert "the remote copy of step 8 is damaged" in caplog.text
    assert "resuming from the local tier's step 4 instead" in caplog.text
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000004"]  # no half download left
    assert "run/step-00000008/__0_0.distcp" in s3.keys("damaged", "run/")  # kept for a look


def upload(server: S3Server, local: Path, bucket: str, prefix: str) -> None:
    client = server.client()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


def test_a_model_and_data_in_s3_train_and_the_export_goes_to_s3(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model.pretrained and data.path on S3 train as their local copies do; export --output s3:// reloads."""
    from fsdp_trainer.export import main as export_main
    from transformers import AutoModelForCausalLM

    from tests.trainer.model.architectures import build_checkpoint

    s3.create_bucket("inputs")
    model_dir = build_checkpoint("qwen2", tmp_path / "qwen2", inputs["tokenizer"])
    upload(s3, model_dir, "inputs", "models/qwen2")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(inputs["ragged"], data_dir / "part-0.jsonl")
    upload(s3, data_dir, "inputs", "data/ragged")

    def config(work: Path, model: str, data: str) -> dict[str, Any]:
        cfg = base_config(work, Path(data), inputs["tokenizer"], training={"maxSteps": 3})
        cfg["model"] = {"pretrained": model}
        cfg["data"] = {"path": data}  # the tokenizer comes with the model
        return cfg

    env = {**s3.env(), "HF_HOME": str(tmp_path / "hf-home")}
    local = launch(tmp_path / "local", config(tmp_path / "local", str(model_dir), str(data_dir))).check()
    remote = launch(
        tmp_path / "remote", config(tmp_path / "remote", "s3://inputs/models/qwen2", "s3://inputs/data/ragged"), env=env
    ).check()
    assert remote.losses() == local.losses(), "the same model and data, read from S3"
    assert (tmp_path / "hf-home" / "s3" / "inputs" / "models" / "qwen2" / "model.safetensors").is_file()

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    export = ["--checkpoint", str(tmp_path / "remote" / "checkpoints"), "--output", "s3://inputs/export"]
    assert export_main(export) == 0
    keys = s3.keys("inputs", "export/")
    assert "export/config.json" in keys and "export/model.safetensors" in keys, keys
    fetched = tmp_path / "fetched"
    for key in keys:
        target = fetched / key.removeprefix("export/")
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.client().download_file("inputs", key, str(target))
    assert type(AutoModelForCausalLM.from_pretrained(fetched)).__name__ == "Qwen2ForCausalLM"
    # A prefix that holds objects is never overwritten.
    with pytest.raises(ConfigError) as refused:
        export_main(export)
    assert refused.value.lines == [
        "--output: s3://inputs/export already holds objects; an upload never overwrites: give a new prefix"
    ]


def test_a_missing_model_prefix_in_s3_is_one_config_line(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "inputs" not in {b["Name"] for b in s3.client().list_buckets()["Buckets"]}:
        s3.create_bucket("inputs")
    for name, value in {**s3.env(), "HF_HOME": str(tmp_path / "hf-home")}.items():
        monkeypatch.setenv(name, value)
    cfg = base_config(tmp_path, inputs["ragged"], inputs["tokenizer"])
    cfg["model"] = {"pretrained": "s3://inputs/models/none"}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as refused:
        check(str(tmp_path / "train.yaml"), "1", 2)
    assert refused.value.lines == ["model.pretrained: s3://inputs/models/none holds no objects"]


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _nodes(
    work: Path, cfg: dict[str, Any], dirs: list[Path], env: dict[str, str], *, own_paths: bool = False
) -> list[tuple[int, str]]:
    """One torchrun "node" per directory on this machine, meeting at a c10d rendezvous on loopback.

    Each node runs in a mount namespace where checkpoint.dir is its directory (pods' emptyDirs at
    one path); with ``own_paths``, each node's checkpoint.dir is its directory's own path instead
    (the local cluster's pods on one host).
    """
    work.mkdir(parents=True, exist_ok=True)
    mount = cfg["checkpoint"]["dir"]
    if not own_paths:
        Path(mount).mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for node, own in enumerate(dirs):
        own.mkdir(parents=True, exist_ok=True)
        config = work / f"train-{node}.yaml"
        config.write_text(
            yaml.safe_dump({**cfg, "checkpoint": {**cfg["checkpoint"], "dir": str(own)}} if own_paths else cfg)
        )
        launch_cmd = [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(dirs)}", "--nproc-per-node=1",
            f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=pernode",
            *trainer_program(config, "--trace-dir", str(work / "trace")),
        ]  # fmt: skip
        bind = f"mount --bind {shlex.quote(str(own))} {shlex.quote(mount)} && "
        script = f"{'' if own_paths else bind}exec {shlex.join(launch_cmd)}"
        procs.append(
            subprocess.Popen(
                ["bash", "-c", script]
                if own_paths
                else ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                env={**offline_env(), **env},
                cwd=work,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    out = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            output, _ = proc.communicate()
        out.append((proc.returncode, output))
    return out


@pytest.mark.skipif(not _unshare_works(), reason="needs mount namespaces (unshare --mount) for per-node directories")
def test_nodes_with_directories_of_their_own_keep_the_steps_in_s3_and_resume_from_them(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server
) -> None:
    """Two nodes, an emptyDir each: no directory holds a whole save, so every step lives in S3."""
    s3.create_bucket("pernode")
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    cfg = remote_config(tmp_path / "run", inputs, "s3://pernode/run")
    cfg["checkpoint"]["dir"] = str(tmp_path / "mnt" / "checkpoints")  # the same path on both nodes
    for node, (rc, output) in enumerate(_nodes(tmp_path / "run", cfg, dirs, s3.env())):
        assert rc == 0, f"node {node}:\n{output[-4000:]}"
    assert committed(s3, "pernode", "run/") == [4, 8]
    manifest = json.loads(s3.client().get_object(Bucket="pernode", Key=f"run/step-00000008/{MANIFEST}")["Body"].read())
    assert {"__0_0.distcp", "__1_0.distcp", "ranks/rank-00001.pt"} <= {o["key"] for o in manifest["objects"]}
    # Each node kept nothing of a save it held only part of; the staging is gone too.
    assert [sorted(p.name for p in d.iterdir()) for d in dirs] == [[], []]

    cfg["training"]["maxSteps"] = 12
    results = _nodes(tmp_path / "run", cfg, dirs, s3.env())
    for node, (rc, output) in enumerate(results):
        assert rc == 0, f"node {node}:\n{output[-4000:]}"
    assert "downloaded step 8 from s3://pernode/run" in results[0][1]
    # Both ranks resumed at step 8, each from the copy its node downloaded into its empty directory.
    for rank in (0, 1):
        trace = read_trace(tmp_path / "run" / "trace" / f"trace-rank{rank}.jsonl")
        assert [r["step"] for r in trace if r["event"] == "start"] == [0, 8], rank
    assert committed(s3, "pernode", "run/") == [8, 12]  # remoteKeepLast 2

    # One node left, with node 0's directory: it holds no partial save to trip over, so it downloads step 12.
    cfg["training"]["maxSteps"] = 14
    ((rc, output),) = _nodes(tmp_path / "run", cfg, dirs[:1], s3.env())
    assert rc == 0, output[-4000:]
    assert "downloaded step 12 from s3://pernode/run" in output
    trace = read_trace(tmp_path / "run" / "trace" / "trace-rank0.jsonl")
    starts = [(r["step"], r["world_size"]) for r in trace if r["event"] == "start"]
    assert starts[-1] == (12, 1)


def test_nodes_whose_directories_are_at_paths_of_their_own_each_resume_from_their_own_download(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server
) -> None:
    """The local cluster's shape: rank 0's step paths are not the other node's, so each rank maps them to its own."""
    s3.create_bucket("ownpaths")
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    cfg = remote_config(tmp_path / "run", inputs, "s3://ownpaths/run", maxSteps=4)
    for node, (rc, output) in enumerate(_nodes(tmp_path / "run", cfg, dirs, s3.env(), own_paths=True)):
        assert rc == 0, f"node {node}:\n{output[-4000:]}"
    assert committed(s3, "ownpaths", "run/") == [4]
    for d in dirs:  # emptyDirs gone with their pods
        shutil.rmtree(d)

    cfg["training"]["maxSteps"] = 6
    results = _nodes(tmp_path / "run", cfg, dirs, s3.env(), own_paths=True)
    for node, (rc, output) in enumerate(results):
        assert rc == 0, f"node {node}:\n{output[-4000:]}"  # before: rank 0 waited in a collective rank 1 skipped
    # Rank 0 (either node: the rendezvous picks) loaded the copy in its own directory.
    said = [f"resumed from {d / 'step-00000004'} at step 4" in out for d, (_, out) in zip(dirs, results, strict=True)]
    assert said.count(True) == 1, [out[-2000:] for _, out in results]
    for rank in (0, 1):
        trace = read_trace(tmp_path / "run" / "trace" / f"trace-rank{rank}.jsonl")
        assert [r["step"] for r in trace if r["event"] == "start"] == [0, 4], rank


def test_a_fork_from_another_trainings_remote_tier_continues_its_step_exactly(
    tmp_path: Path, inputs: dict[str, Path], s3: S3Server
) -> None:
    s3.create_bucket("fork")
    env = s3.env()
    source_work = tmp_path / "source"
    source = launch(source_work, remote_config(source_work, inputs, "s3://fork/base", maxSteps=6), env=env).check()
    assert committed(s3, "fork", "base/") == [4, 6]
    keys_before = sorted(s3.keys("fork", "base/"))

    # The fork downloads the source's step 4 into its dir and trains on from there, into a remote tier of its own.
    work = tmp_path / "fork"
    cfg = base_config(
        work,
        inputs["ragged"],
        inputs["tokenizer"],
        training={"maxSteps": 6, "minLearningRateRatio": 1.0},
        checkpoint={"intervalSteps": 4, "resumeFrom": "s3://fork/base/step-00000004", "remote": "s3://fork/mine"},
    )
    fork = launch(work, cfg, env=env).check()
    assert fork.events("start")[0]["step"] == 4
    assert fork.losses() == {step: loss for step, loss in source.losses().items() if step > 4}
    assert [step for step, _ in complete_checkpoints(work / "checkpoints")] == [6]
    # Its tier holds only its own steps: the source's step 4 there would be another training's newest
    # step, and the tier's owner check would refuse every restart.
    assert committed(s3, "fork", "mine/") == [6]
    assert sorted(s3.keys("fork", "base/")) == keys_before  # the source is only read
    downloaded = work / "checkpoints" / ".resume-from"
    assert (downloaded / "step-00000004").is_dir()

    # Restarted, it resumes its own step 6, and the downloaded copy is deleted.
    cfg["training"]["maxSteps"] = 7
    again = launch(work, cfg, nproc=None, env=env).check()  # one process: DCP reshards the two ranks' step
    assert again.events("start")[-1]["step"] == 6
    assert not downloaded.exists()
    assert [step for step, _ in complete_checkpoints(work / "checkpoints")] == [6, 7]

    # The whole remote tier as the source: its newest committed step.
    newest_cfg = base_config(
        tmp_path / "newest",
        inputs["ragged"],
        inputs["tokenizer"],
        training={"maxSteps": 7, "minLearningRateRatio": 1.0},
        checkpoint={"intervalSteps": 4, "resumeFrom": "s3://fork/base"},
    )
    newest = launch(tmp_path / "newest", newest_cfg, nproc=None, env=env).check()
    assert newest.events("start")[0]["step"] == 6

    # A prefix with nothing committed: one config line, nothing trained.
    empty_cfg = base_config(
        tmp_path / "empty",
        inputs["ragged"],
        inputs["tokenizer"],
        training={"maxSteps": 7},
        checkpoint={"resumeFrom": "s3://fork/nothing-here"},
    )
    refused = launch(tmp_path / "empty", empty_cfg, nproc=None, env=env)
    assert refused.returncode == 2, refused.output
    assert "  checkpoint.resumeFrom: no committed step under s3://fork/nothing-here\n" in refused.output
    assert not complete_checkpoints(tmp_path / "empty" / "checkpoints")
