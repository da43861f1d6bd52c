"""Resume after a real process kill is exact, and an interrupted save is never resumed.

The kill is a SIGKILL of rank 0 (``FSDP_TRAINER_FAULT``) with torchrun allowed
one restart, as a node loss under Kubernetes would be: torchrun tears the
worker group down, starts it again, and the trainer resumes from the newest
complete checkpoint on its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api.contract import (
    CHECKPOINT_SAVE_DURATION,
    ENV_TRAINER_FAULT,
    LOSS,
    TENSORBOARD_SUBDIR,
    WANDB_RUN_FILE,
    WANDB_SUBDIR,
)
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_trainer.checkpoint import MARKER, complete_checkpoints
from fsdp_trainer.trace import read_trace
from fsdp_trainer.tracking import series_tag
from fsdp_trainer.tracking.wandb_log import history as wandb_history
from fsdp_trainer.tracking.wandb_log import run_files

from tests.trainer.checkpoint.resume_runs import effective_steps, split_attempts
from tests.trainer.harness import base_config, kill_tree, launch, offline_env
from tests.trainer.tracking.board import read_scalars
from tests.trainer.tracking.mlflow_server import MlflowServer

pytestmark = pytest.mark.slow


def test_killed_run_resumes_with_identical_losses_and_data(
    tmp_path: Path, inputs: dict[str, Path], mlflow_server: MlflowServer
) -> None:
    def config(name: str) -> dict[str, Any]:
        mlflow = {"uri": mlflow_server.uri, "experiment": f"resume-{name}", "flushSeconds": 1}
        return base_config(
            tmp_path / name,
            inputs["ragged"],
            inputs["tokenizer"],
            training={"gradAccumSteps": 2},
            checkpoint={"intervalSteps": 5, "keepLast": 2},
            tracking={
                "tensorboard": {"flushSeconds": 1},
                "mlflow": mlflow,
                "wandb": {"project": f"resume-{name}", "mode": "offline"},
            },
        )

    straight = launch(tmp_path / "straight", config("straight")).check()
    killed = launch(
        tmp_path / "killed", config("killed"), env={ENV_TRAINER_FAULT: "after_step:13"}, max_restarts=1
    ).check()

    attempts = split_attempts(killed, 0)
    assert [a[0]["step"] for a in attempts] == [0, 10], "one kill after step 13, resumed from step 10"
    assert max(r["step"] for r in attempts[0] if r["event"] == "step") == 13
    assert "resumed from" in killed.output and "step-00000010" in killed.output

    for rank in (0, 1):
        want, got = straight.events("step", rank), effective_steps(killed, rank)
        assert [r["step"] for r in got] == list(range(1, 21))
        # fp32, same seed, same data: the resumed run is the same computation.
        for a, b in zip(want, got, strict=True):
            assert abs(a["loss"] - b["loss"]) <= 1e-6, (a["step"], a["loss"], b["loss"])
            assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)
        # Same samples in the same order: nothing repeated, nothing skipped.
        assert [r["samples"] for r in got] == [r["samples"] for r in want]

    samples = [s for rank in (0, 1) for r in effective_steps(killed, rank) for s in r["samples"]]
    assert len(samples) == len(set(samples)) == 20 * 2 * 2 * 2
    # Windows cross document boundaries, so the resumed position was mid-document.
    assert any(not s.endswith("@0") for s in samples)
    # keepLast 2: only the two newest complete checkpoints remain.
    assert [step for step, _ in complete_checkpoints(tmp_path / "killed" / "checkpoints")] == [15, 20]

    # spec.tracking.tensorboard: one run across the kill, each step once (TensorBoard's own reader),
    # with the losses of the steps that count; rank 0 logged steps 11-13 twice, and the purge hides the first.
    board = tmp_path / "killed" / "checkpoints" / TENSORBOARD_SUBDIR
    logged = read_scalars(board, series_tag(LOSS))
    assert [s for s, _ in logged] == list(range(1, 21))
    for (step, loss), record in zip(logged, effective_steps(killed, 0), strict=True):
        assert loss == pytest.approx(record["loss"], rel=1e-6), step
    assert [s for s, _ in read_scalars(board, series_tag(CHECKPOINT_SAVE_DURATION))] == [5, 10, 15, 20]
    assert len(list(board.glob("events.out.tfevents.*"))) == 2  # one file per attempt

    # spec.tracking.mlflow: one run across the kill, each step once, with the losses of the steps that count
    # (a step both attempts logged keeps the first value: the same computation, to 1e-6).
    from mlflow.tracking import MlflowClient

    tracker = MlflowClient(tracking_uri=mlflow_server.uri)
    [run] = tracker.search_runs([tracker.get_experiment_by_name("resume-killed").experiment_id])
    history = sorted((m.step, m.value) for m in tracker.get_metric_history(run.info.run_id, series_tag(LOSS)))
    assert [s for s, _ in history] == list(range(1, 21))
    for (step, loss), record in zip(history, effective_steps(killed, 0), strict=True):
        assert loss == pytest.approx(record["loss"], rel=1e-6), step
    assert run.info.status == "FINISHED" and run.data.params["training.maxSteps"] == "20"
    saves = tracker.get_metric_history(run.info.run_id, series_tag(CHECKPOINT_SAVE_DURATION))
    assert sorted(m.step for m in saves) == [5, 10, 15, 20]
    # The resumed process skipped what the run held: the checkpoint at 10 sent everything before it, and
    # steps 11-13 reached the server only if a flush (every second) fell between them and the kill.
    [continued] = re.findall(r"mlflow run \S+, continued after step (\d+)", killed.output)
    assert 10 <= int(continued) <= 13

    # spec.tracking.wandb (offline): one run across the kill, one folder per attempt, each step once, with
    # the losses of the steps that count; the resumed process skipped the steps the first one wrote.
    wandb_dir = tmp_path / "killed" / "checkpoints" / WANDB_SUBDIR
    run_id = json.loads((tmp_path / "killed" / "checkpoints" / WANDB_RUN_FILE).read_text())["run_id"]
    files = run_files(wandb_dir, run_id)
    assert len(files) == 2
    rows = [row for path in files for row in wandb_history(path) if series_tag(LOSS) in row]
    assert [r["_step"] for r in rows] == list(range(1, 21))
    for row, record in zip(rows, effective_steps(killed, 0), strict=True):
        assert row[series_tag(LOSS)] == pytest.approx(record["loss"], rel=1e-6), row["_step"]
    [continued] = re.findall(r"wandb run \S+ \(offline run \w+; .*\), continued after step (\d+)", killed.output)
    assert 10 <= int(continued) <= 13


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_an_interrupted_save_is_never_picked_by_resume(
    tmp_path: Path, inputs: dict[str, Path], async_save: bool
) -> None:
    work = tmp_path / "run"
    cfg = base_config(
        work,
        inputs["ragged"],
        inputs["tokenizer"],
        training={"maxSteps": 4},
        checkpoint={"intervalSteps": 2, "asyncSave": async_save},
    )
    ckpt_dir = work / "checkpoints"

    crashed = launch(work, cfg, env={ENV_TRAINER_FAULT: "during_save:4"})
    assert crashed.returncode != 0
    tmp_dirs = [p for p in ckpt_dir.iterdir() if p.name.startswith("step-00000004.tmp-")]
    assert len(tmp_dirs) == 1, sorted(p.name for p in ckpt_dir.iterdir())
    # The shards and DCP metadata were fully written; only the marker and rename are missing.
    assert (tmp_dirs[0] / ".metadata").is_file() and not (tmp_dirs[0] / MARKER).exists()
    assert [step for step, _ in complete_checkpoints(ckpt_dir)] == [2]

    # A directory with the final name but no marker (e.g. a copy cut short) is ignored too.
    fake = ckpt_dir / "step-00000006"
    shutil.copytree(ckpt_dir / "step-00000002", fake)
    (fake / MARKER).unlink()

    resumed = launch(work, cfg).check()
    assert resumed.events("start")[-1]["step"] == 2
    assert not any(p.name.startswith("step-00000004.tmp-") for p in ckpt_dir.iterdir()), "stale tmp dir removed"
    assert [step for step, _ in complete_checkpoints(ckpt_dir)] == [2, 4]
    # Steps 3 and 4 were recomputed from step 2: the same numbers as before the crash.
    before = {r["step"]: r["loss"] for r in split_attempts(resumed, 0)[0] if r["event"] == "step"}
    after = resumed.losses()
    assert after[3] == pytest.approx(before[3], abs=1e-6) and after[4] == pytest.approx(before[4], abs=1e-6)


def test_sigterm_checkpoints_the_current_step_and_resume_starts_there(tmp_path: Path, inputs: dict[str, Path]) -> None:
    """What a pod deletion does: SIGTERM to the container's torchrun, which passes it on."""
    work = tmp_path / "run"
    cfg = base_config(
        work,
        inputs["ragged"],
        inputs["tokenizer"],
        training={"maxSteps": 100000},  # would run for hours: only the signal ends it
        checkpoint={"intervalSteps": 100000},
    )
    work.mkdir()
    (work / "train.yaml").write_text(yaml.safe_dump(cfg))
    trace = work / "trace" / "trace-rank0.jsonl"
    cmd = torchrun_standalone(2, trainer_program(work / "train.yaml", "--trace-dir", str(work / "trace")))
    proc = subprocess.Popen(
        cmd, env=offline_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (trace.exists() and sum(1 for r in read_trace(trace) if r["event"] == "step") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-4000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # to torchrun only, like the kubelet
        output, _ = proc.communicate(timeout=120)
        assert "stopped on SIGTERM after step" in output, output[-4000:]
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    assert proc.returncode != 0, "a stopped run must not look finished"
    records = read_trace(trace)
    (stopped,) = [r for r in records if r["event"] == "stopped"]
    last = max(r["step"] for r in records if r["event"] == "step")
    assert stopped["step"] == last >= 3
    assert [s for s, _ in complete_checkpoints(work / "checkpoints")] == [last]

    cfg["training"]["maxSteps"] = last + 2
    resumed = launch(work, cfg).check()
    assert resumed.events("start")[-1]["step"] == last
    assert sorted(resumed.losses())[-2:] == [last + 1, last + 2]


def test_a_checkpoint_resumes_on_another_world_size(tmp_path: Path, inputs: dict[str, Path]) -> None:
    """Elastic scale-down: DCP reshards model and optimizer; the data moves to a fresh epoch."""
    work = tmp_path / "run"
    cfg = base_config(work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 4})
    two = launch(work, cfg).check()
    cfg["training"]["maxSteps"] = 6
    one = launch(work, cfg, nproc=None).check()
    start = one.events("start")[-1]
    assert (start["step"], start["world_size"]) == (4, 1)
    assert "cannot be mapped to world size 1; continuing at epoch 1" in one.output
    steps = [r for r in one.events("step") if r["step"] > 4]
    assert [r["step"] for r in steps] == [5, 6]
    assert all(s.startswith("e1/") for r in steps for s in r["samples"])
    # The trained weights came back: the loss continues from where 2 ranks left it, not from scratch.
    assert steps[0]["loss"] < two.losses()[1] - 0.1


def test_a_checkpoint_of_another_architecture_is_refused_by_name(tmp_path: Path, inputs: dict[str, Path]) -> None:
    """With numLayers lowered, DCP would load the layers that exist, drop the rest and train on."""
    work = tmp_path / "run"
    cfg = base_config(work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 3})
    launch(work, cfg, nproc=None).check()
    # What may change across a resume does not stop it...
    cfg["training"].update(maxSteps=4, learningRate=1e-3)
    launch(work, cfg, nproc=None).check()
    # ...but the model's shape does.
    cfg["training"]["maxSteps"] = 5
    cfg["model"]["config"]["numLayers"] = 1
    refused = launch(work, cfg, nproc=None)
    assert refused.returncode == 2, refused.output[-3000:]
    assert "model: the checkpoint has tensors this model lacks: model.layers.1." in refused.output
    # The pod's config check says it first, once, before torchrun (issue 24: every rank, every restart).
    from fsdp_trainer.check import check
    from fsdp_trainer.errors import ConfigError

    (work / "changed.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        check(str(work / "changed.yaml"), "1", 2)
    assert info.value.lines[0].startswith("model: the checkpoint has tensors this model lacks: model.layers.1.")
    assert info.value.lines[-1].startswith("checkpoint.dir: resuming needs the checkpoint's architecture")
    assert "holds another architecture" in refused.output
    assert "Traceback" not in refused.output
    # The trace accumulates over the three runs: the refused one trained nothing.
    assert max(r["step"] for r in refused.events("step")) == 4


def _corrupt_shard(ckpt: Path) -> None:
    """Cut a DCP shard file to half its size, as a full disk or a copy cut short would."""
    shard = sorted(ckpt.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _garbage_rank_file(ckpt: Path, rank: int) -> None:
    (ckpt / "ranks" / f"rank-{rank:05d}.pt").write_bytes(os.urandom(512))


@pytest.mark.parametrize("damage", ["shard", "rank-1-file"])
def test_an_unloadable_newest_checkpoint_falls_back_and_is_set_aside(
    tmp_path: Path, inputs: dict[str, Path], damage: str
) -> None:
    """Resume takes the newest checkpoint every rank can load, and keeps the bad one under another name."""
    work = tmp_path / "run"
    cfg = base_config(
        work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 10}, checkpoint={"intervalSteps": 5}
    )
    first = launch(work, cfg).check()
    ckpt_dir = work / "checkpoints"
    newest = ckpt_dir / "step-00000010"
    if damage == "shard":
        _corrupt_shard(newest)
    else:
        _garbage_rank_file(newest, 1)  # only rank 1 fails: every rank must still agree on step 5
    damaged = {p.relative_to(newest): p.read_bytes() for p in newest.rglob("*") if p.is_file()}

    cfg["training"]["maxSteps"] = 12
    resumed = launch(work, cfg).check()
    assert resumed.events("start")[-1]["step"] == 5
    assert "step-00000010 could not be loaded" in resumed.output
    # Set aside, byte for byte, never deleted; a new step-10 checkpoint was saved beside it.
    aside = ckpt_dir / "step-00000010.unloadable"
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == damaged
    assert [s for s, _ in complete_checkpoints(ckpt_dir)] == [5, 10, 12]
    # Steps 6-10 were recomputed from step 5: the same numbers as the first run.
    before, after = first.losses(), resumed.losses()
    for step in range(6, 11):
        assert after[step] == pytest.approx(before[step], abs=1e-6), step


def test_when_no_checkpoint_loads_the_run_stops_and_renames_nothing(tmp_path: Path, inputs: dict[str, Path]) -> None:
    work = tmp_path / "run"
    cfg = base_config(
        work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 4}, checkpoint={"intervalSteps": 2}
    )
    launch(work, cfg, nproc=None).check()
    ckpt_dir = work / "checkpoints"
    for step in (2, 4):
        _corrupt_shard(ckpt_dir / f"step-{step:08d}")
    cfg["training"]["maxSteps"] = 6
    stopped = launch(work, cfg, nproc=None)
    assert stopped.returncode == 1, stopped.output[-3000:]
    assert f"fsdp-train: no checkpoint under {ckpt_dir} can be loaded: step-00000004: " in stopped.output
    assert "; step-00000002: " in stopped.output and "Nothing was renamed or deleted" in stopped.output
    assert "Traceback" not in stopped.output
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step-00000002", "step-00000004"]


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> Path:
    """One single-process run to a checkpoint of step 4, which each test copies (a launch less each)."""
    work = tmp_path_factory.mktemp("four-steps") / "run"
    launch(work, _four_step_config(work, inputs), nproc=None).check()
    return work


def _four_step_config(work: Path, inputs: dict[str, Path]) -> dict[str, Any]:
    return base_config(
        work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 4}, checkpoint={"intervalSteps": 4}
    )


@pytest.mark.parametrize("where", [".metadata", "train.step"])
def test_a_crafted_checkpoint_stops_resume_and_export_without_running_it(
    tmp_path: Path, inputs: dict[str, Path], where: str, four_steps: Path
) -> None:
    """Whoever can write the checkpoint volume cannot run code in the ranks or in export (issue 24, 1).

    Before the fix the resume looked normal ("resumed ... at step 4", exit 0) and the marker existed.
    """
    from fsdp_trainer.__main__ import main as cli

    from tests.trainer.checkpoint.crafted import plant_in_item, plant_in_metadata

    work = tmp_path / "run"
    cfg = _four_step_config(work, inputs)
    shutil.copytree(four_steps, work)
    ckpt = work / "checkpoints" / "step-00000004"
    marker = tmp_path / "pwned"
    if where == ".metadata":
        plant_in_metadata(ckpt, marker)
    else:
        plant_in_item(ckpt, where, marker)
    named = f"{ckpt}/.metadata" if where == ".metadata" else f"{ckpt} (item {where})"

    cfg["training"]["maxSteps"] = 6
    stopped = launch(work, cfg, nproc=None)
    assert stopped.returncode == 1, stopped.output[-3000:]
    assert f"fsdp-train: {named}: refusing to load it" in stopped.output, stopped.output[-3000:]
    assert "Traceback" not in stopped.output
    assert not marker.exists()
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["step-00000004"]  # nothing set aside or deleted

    # Export reads the metadata, and of the items only the model's tensors: a planted step is never read.
    out = tmp_path / "exported"
    refused = where == ".metadata"
    assert cli(["export", "--checkpoint", str(ckpt), "--output", str(out)]) == (1 if refused else 0)
    assert not marker.exists() and out.exists() is not refused


def test_a_checkpoint_dir_of_another_run_is_refused_in_one_line_and_left_alone(
    tmp_path: Path, inputs: dict[str, Path], four_steps: Path
) -> None:
    """Two trainings in one directory, or resume: never over a used one, mixed runs (issue 24, 4 and 5).

    Before: the second training resumed from the first one's checkpoint and pruned it; resume: never
    trained from step 0 beside the old checkpoints and pruning by step number deleted the new ones.
    """
    work = tmp_path / "run"
    cfg = _four_step_config(work, inputs)
    shutil.copytree(four_steps, work)
    ckpt_dir = work / "checkpoints"
    before = {p.relative_to(ckpt_dir): p.read_bytes() for p in ckpt_dir.rglob("*") if p.is_file()}
    held = f"checkpoint.dir: {ckpt_dir} already holds 1 checkpoint(s), the newest of step 4"

    other = {**cfg, "job": {"name": "other-training"}, "training": {**cfg["training"], "maxSteps": 6}}
    refused = launch(work, other, nproc=None)
    assert refused.returncode == 2, refused.output[-3000:]
    assert f"  {held}, of training default/core-test; this is default/other-training." in refused.output
    assert "give each its own checkpoint.dir" in refused.output and "Traceback" not in refused.output

    fresh = {**cfg, "checkpoint": {**cfg["checkpoint"], "resume": "never"}}
    refused = launch(work, fresh, nproc=None)
    assert refused.returncode == 2, refused.output[-3000:]
    assert f"  {held}; checkpoint.resume: never would mix this run's checkpoints with them" in refused.output

    assert {p.relative_to(ckpt_dir): p.read_bytes() for p in ckpt_dir.rglob("*") if p.is_file()} == before
    # The same training resumes as before.
    cfg["training"]["maxSteps"] = 6
    assert launch(work, cfg, nproc=None).check().events("start")[-1]["step"] == 4
