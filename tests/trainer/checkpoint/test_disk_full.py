"""A checkpoint volume that fills up during a save: one error line, the partial save gone, older ones intact.

A full filesystem cannot be made without root, so the real trainer runs
with DCP's file writes failing with ENOSPC at the boundary: a
``sitecustomize`` on the ranks' PYTHONPATH replaces
``FileSystem.create_stream`` so that writing a shard of the chosen step's
save puts a few KiB on disk and then fails, as a write to a full volume does.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fsdp_trainer.checkpoint import TMP_DIR, complete_checkpoints, step_dir_name
from fsdp_trainer.checkpoint.layout import new_tmp_dir
from fsdp_trainer.checkpoint.manager import Checkpointer, disk_full_error
from fsdp_trainer.checkpoint.state import write_rank_state
from fsdp_trainer.errors import CheckpointSaveError

from tests.trainer.harness import base_config, launch

ENV_FULL_AT_STEP = "FSDP_TEST_ENOSPC_STEP"

SHIM = f"""
import os

_step = os.environ.get({ENV_FULL_AT_STEP!r})
if _step:
    import contextlib, errno
    from torch.distributed.checkpoint import filesystem

    _create_stream = filesystem.FileSystem.create_stream
    _partial = "step-%08d.tmp-" % int(_step)

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if "w" in mode and _partial in str(path):
            with open(path, "wb") as f:
                f.write(bytes(4096))  # what fitted before the volume was full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        with _create_stream(self, path, mode) as stream:
            yield stream

    filesystem.FileSystem.create_stream = create_stream
"""


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _config(work: Path, inputs: dict[str, Path], **checkpoint: object) -> dict:
    checkpoint = {"intervalSteps": 2, "keepLast": 1, **checkpoint}
    return base_config(
        work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 2, "warmupSteps": 1}, checkpoint=checkpoint
    )


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> Path:
    """One 2-rank run to a checkpoint of step 2, which each test copies and resumes (a launch less each)."""
    work = tmp_path_factory.mktemp("disk-full") / "run"
    launch(work, _config(work, inputs)).check()
    return work


def _copy_run(src: Path, work: Path, checkpoints: Path | None = None) -> None:
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("checkpoints"))
    shutil.copytree(src / "checkpoints", checkpoints or work / "checkpoints")


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_volume_is_one_line_and_keeps_the_older_checkpoints(
    tmp_path: Path, inputs: dict[str, Path], async_save: bool, two_steps: Path
) -> None:
    work = tmp_path / "run"
    root = work / "checkpoints"
    cfg = _config(work, inputs, asyncSave=async_save)
    _copy_run(two_steps, work)
    older = root / step_dir_name(2)
    before = _digests(older)
    assert before and "COMPLETE" in before

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    cfg["training"]["maxSteps"] = 6  # resumes at 2; the save of step 4 finds the volume full
    env = {
        ENV_FULL_AT_STEP: "4",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])),
    }
    run = launch(work, cfg, env=env)

    assert run.returncode == 1, run.output[-4000:]
    expected = re.compile(
        rf"fsdp-train: checkpoint\.dir {re.escape(str(root))}: cannot save the checkpoint of step 4: "
        rf"{re.escape(os.strerror(errno.ENOSPC))}\. The partial step-00000004\.tmp-[0-9a-f]{{8}} was removed and "
        r"older checkpoints were kept; free space on the checkpoint volume \(or make it larger\), then restart "
        r"to resume from the newest complete checkpoint"
    )
    lines = [line for line in run.output.splitlines() if line.startswith("fsdp-train: ")]
    assert lines and all(expected.fullmatch(line) for line in lines), run.output[-6000:]
    assert "No space left on device" in lines[0]
    assert "CheckpointException" not in run.output, "DCP's traceback of every rank, not one line"
    # keepLast 1 would have pruned step 2 after a successful save of step 4: nothing was pruned to make room.
    assert complete_checkpoints(root) == [(2, older)]
    assert _digests(older) == before
    assert not [p.name for p in root.iterdir() if TMP_DIR.match(p.name) or p.name == step_dir_name(4)]

    # With space again, the next run resumes from step 2 and finishes.
    resumed = launch(work, cfg).check()
    assert resumed.events("start")[-1]["step"] == 2
    assert [s for s, _ in complete_checkpoints(root)] == [6]


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs: room for one checkpoint of the test model (1.4 MB), not for two."""
    volume = tmp_path / "volume"
    volume.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(volume)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield volume
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)


@pytest.mark.slow
def test_a_really_full_volume_is_the_same_one_line_and_gives_its_space_back(
    tmp_path: Path, inputs: dict[str, Path], small_volume: Path, two_steps: Path
) -> None:
    """On a real full filesystem DCP's writer fails with torch's RuntimeError ("unexpected pos"), not an
    OSError (issue 24, 6): before, that was a 200-line crash, and the partial save kept the space."""
    work = tmp_path / "run"
    root = small_volume / "checkpoints"
    cfg = _config(work, inputs, dir=str(root))
    _copy_run(two_steps, work, root)
    older = root / step_dir_name(2)
    before = _digests(older)
    # Fill the volume but for 1 KiB: the save of step 4 fails in its first file, a rank file.
    filler = small_volume / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(4096))
    filler.write_bytes(bytes(max(0, filler.stat().st_size - 1024)))
    cfg["training"]["maxSteps"] = 6  # resumes at 2; the save of step 4 does not fit
    run = launch(work, cfg)
    assert run.returncode == 1, run.output[-4000:]
    lines = [line for line in run.output.splitlines() if line.startswith("fsdp-train: ")]
    assert lines, run.output[-6000:]
    assert all(f"cannot save the checkpoint of step 4: {os.strerror(errno.ENOSPC)}. The partial" in x for x in lines)
    # (torchrun itself, which the pods' supervising check replaces, still prints its ChildFailedError.)
    assert "]: Traceback" not in run.output and "RuntimeError" not in run.output, run.output[-6000:]
    assert complete_checkpoints(root) == [(2, older)] and _digests(older) == before
    assert sorted(p.name for p in root.iterdir()) == [step_dir_name(2)]  # the partial save's space is free again
    assert "unexpected pos" not in run.output


def _fill(volume: Path) -> None:
    with (volume / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(4096))


def test_a_rank_file_that_does_not_fit_says_enospc(small_volume: Path) -> None:
    """torch.save straight onto a full volume says RuntimeError without the errno; the rank file's write says ENOSPC."""
    _fill(small_volume)
    state = {"step": 4, "rng": torch.zeros(4096)}
    with pytest.raises(RuntimeError, match=r"unexpected pos|iostream|write"):
        torch.save(state, small_volume / "direct.pt")
    with pytest.raises(OSError) as caught:
        write_rank_state(small_volume / "rank-00000.pt", state)
    assert caught.value.errno == errno.ENOSPC and disk_full_error(caught.value) is caught.value


def _checkpointer(root: Path) -> Checkpointer:
    ckpt = Checkpointer.__new__(Checkpointer)  # only its root is used by the disk-full path
    ckpt.root = root
    return ckpt


def test_a_partial_save_a_peer_removed_is_the_full_volume_and_not_a_crash(tmp_path: Path) -> None:
    """Seen under load: rank 0's write failed without an errno while rank 1, which found the volume full,
    had already removed the partial save and so given the space back: rank 0's own look saw room."""
    root = tmp_path / "checkpoints"
    root.mkdir()
    tmp = new_tmp_dir(root / step_dir_name(4))
    ckpt = _checkpointer(root)
    said = rf"step 4: {os.strerror(errno.ENOSPC)}\. The partial"
    with pytest.raises(CheckpointSaveError, match=said), ckpt._disk_full_is_one_line(4, tmp):
        raise RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 64 vs 0")
    # The partial save still there and room on the volume: not a full volume, the error passes through.
    tmp.mkdir()
    with pytest.raises(RuntimeError, match="unexpected pos"), ckpt._disk_full_is_one_line(4, tmp):
        raise RuntimeError("unexpected pos 64 vs 0")
