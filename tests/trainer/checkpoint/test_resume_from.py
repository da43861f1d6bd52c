"""``checkpoint.resumeFrom``: a new training continues another one's step exactly, and only reads it.

A fork starts where its source's step left off (weights, optimizer, schedule,
data position, step), writes to its own dir and resumes from there afterwards;
the source's files are as they were. A source trained on other data, or one
that is not there, is one config line before anything is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fsdp_trainer.checkpoint import complete_checkpoints

from tests.trainer.harness import base_config, launch

pytestmark = pytest.mark.slow


def _config(workdir: Path, inputs: dict[str, Path], **checkpoint: Any) -> dict[str, Any]:
    return base_config(
        workdir,
        inputs["ragged"],
        inputs["tokenizer"],
        training={"maxSteps": 8},
        checkpoint={"intervalSteps": 4, "keepLast": 5, **checkpoint},
    )


def _files(root: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


def test_a_fork_continues_its_sources_step_exactly_and_leaves_the_source_as_it_was(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    source = launch(tmp_path / "source", _config(tmp_path / "source", inputs), nproc=None).check()
    checkpoints = tmp_path / "source" / "checkpoints"
    before = _files(checkpoints)

    fork_cfg = _config(tmp_path / "fork", inputs, resumeFrom=str(checkpoints / "step-00000004"))
    fork = launch(tmp_path / "fork", fork_cfg, nproc=None).check()
    assert fork.events("start")[0]["step"] == 4
    assert fork.losses() == {step: loss for step, loss in source.losses().items() if step > 4}
    assert [step for step, _ in complete_checkpoints(tmp_path / "fork" / "checkpoints")] == [8]
    assert _files(checkpoints) == before  # only read: nothing renamed, pruned or written

    # Restarted with more steps, the fork resumes its own step 8, not the source's step 4.
    fork_cfg["training"]["maxSteps"] = 10
    again = launch(tmp_path / "fork", fork_cfg, nproc=None).check()
    assert again.events("start")[-1]["step"] == 8
    assert [step for step, _ in complete_checkpoints(tmp_path / "fork" / "checkpoints")] == [8, 10]

    # A checkpoint dir as the source: its newest complete step.
    newest = launch(tmp_path / "newest", _config(tmp_path / "newest", inputs, resumeFrom=str(checkpoints)), nproc=None)
    assert newest.check().events("start")[0]["step"] == 8
    assert _files(checkpoints) == before

    # Another sequence length: the saved data position would count in other windows.
    other = _config(tmp_path / "other", inputs, resumeFrom=str(checkpoints))
    other["training"]["seqLen"] = 16
    refused = launch(tmp_path / "other", other, nproc=None)
    assert refused.returncode == 2, refused.output
    assert (
        f"  checkpoint.resumeFrom: {checkpoints} trained with training.seqLen: 32, this training has 16; the saved "
        "data position counts in its own data (use its data, or start fresh)"
    ) in refused.output
    assert not (tmp_path / "other" / "checkpoints").exists() or not any((tmp_path / "other" / "checkpoints").iterdir())


def test_a_source_that_is_not_there_is_one_line(tmp_path: Path, inputs: dict[str, Path]) -> None:
    missing = tmp_path / "nowhere" / "step-00000004"
    run = launch(tmp_path / "run", _config(tmp_path / "run", inputs, resumeFrom=str(missing)), nproc=None)
    assert run.returncode == 2, run.output
    assert f"  checkpoint.resumeFrom: {missing} does not exist\n" in run.output
