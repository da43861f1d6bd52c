"""Which directories count as checkpoints: only complete (marked), final ones."""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_trainer.checkpoint import MARKER, complete_checkpoints, latest_checkpoint, remove_stale


def test_only_marked_final_directories_are_checkpoints(tmp_path: Path) -> None:
    for name, marked in [("step-00000010", True), ("step-00000020", True), ("step-00000030", False)]:
        (tmp_path / name).mkdir()
        if marked:
            (tmp_path / name / MARKER).write_text(json.dumps({"step": int(name[5:])}))
    (tmp_path / "step-00000040.tmp-1a2b").mkdir()
    (tmp_path / "step-00000040.tmp-1a2b" / MARKER).write_text("{}")  # marked, but never renamed
    (tmp_path / "notes").mkdir()
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [10, 20]
    assert latest_checkpoint(tmp_path) == (20, tmp_path / "step-00000020")
    assert remove_stale(tmp_path) == [tmp_path / "step-00000040.tmp-1a2b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step-00000010", "step-00000020", "step-00000030"]
    assert latest_checkpoint(tmp_path / "missing") is None
