"""A checkpoint volume that fills up during a save: one error line, the partial save gone, older ones intact.

A full filesystem cannot be made without root, so the real trainer runs
with DCP's file writes failing with ENOSPC at the boundary: a
``sitecustomize`` on the ranks' PYTHONPATH replaces
``FileSystem.create_stream`` so that writing a shard of the chosen step's
save puts a few KiB on disk and then fails, as a write to a full volume does.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path

import pytest
from fsdp_trainer.checkpoint import TMP_DIR, complete_checkpoints, step_dir_name

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


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_volume_is_one_line_and_keeps_the_older_checkpoints(
    tmp_path: Path, inputs: dict[str, Path], async_save: bool
) -> None:
    work = tmp_path / "run"
    root = work / "checkpoints"
    checkpoint = {"intervalSteps": 2, "keepLast": 1, "asyncSave": async_save}
    cfg = base_config(
        work, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 2, "warmupSteps": 1}, checkpoint=checkpoint
    )
    launch(work, cfg).check()
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
