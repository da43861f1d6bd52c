"""Which directories count as checkpoints: only complete (marked), final ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
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


class _Payload:
    """What an attacker with write access to the checkpoint volume would plant in a rank file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_rank_file_is_refused_without_running_it(tmp_path: Path) -> None:
    import pickle

    from fsdp_trainer.checkpoint import load_rank_state
    from fsdp_trainer.errors import UnsafeCheckpointError

    marker = tmp_path / "pwned"
    rank_file = tmp_path / "rank-00000.pt"
    rank_file.write_bytes(pickle.dumps({"step": 1, "data": _Payload(marker)}, protocol=2))  # as torch.save writes
    with pytest.raises(UnsafeCheckpointError, match=rf"{re.escape(str(rank_file))}: refusing to load it"):
        load_rank_state(rank_file)
    assert not marker.exists()


# Seeded garbage that fails in each of the places torch.load can fail (found by
# trying seeds): in the weights-only unpickler, and in torch's own legacy-format
# parsing before the unpickler judges anything. Random bytes made this test flaky.
_GARBAGE_SEEDS = {
    0: "Unsupported operand",
    2: "IndexError: pop from empty list",
    20: "KeyError",
    195: "UnicodeDecodeError",
}


@pytest.mark.parametrize("seed", sorted(_GARBAGE_SEEDS))
def test_a_garbage_rank_file_is_damage_not_an_attack(tmp_path: Path, seed: int) -> None:
    """Garbage fails as ValueError naming the file, so resume falls back instead of stopping."""
    import random

    from fsdp_trainer.checkpoint import load_rank_state

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(random.Random(seed).randbytes(512))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(garbage))}: damaged \(.*{_GARBAGE_SEEDS[seed]}"):
        load_rank_state(garbage)


def test_a_damaged_rank_file_is_damage_not_an_attack(tmp_path: Path) -> None:
    """A legacy-format file with a wrong magic number and a cut-short zip are ValueErrors too."""
    import pickle

    import torch
    from fsdp_trainer.checkpoint import load_rank_state

    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps(42, protocol=2))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(legacy))}: damaged \(RuntimeError: Invalid magic number"):
        load_rank_state(legacy)
    cut = tmp_path / "cut.pt"
    torch.save({"step": 1, "data": {"epoch": 0}}, cut)
    cut.write_bytes(cut.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(cut))}: damaged \(.*failed finding central directory"):
        load_rank_state(cut)


def test_a_rank_state_as_the_trainer_writes_it_loads_and_restores_the_rngs(tmp_path: Path) -> None:
    import random

    import numpy as np
    import torch
    from fsdp_trainer.checkpoint import load_rank_state, rng_state, set_rng_state

    np.random.seed(7)
    random.seed(7)
    rank_file = tmp_path / "rank-00000.pt"
    state = {"step": 3, "data": {"docs": {"kind": "map", "epoch": 0, "next": 5}}, "rng": rng_state()}
    torch.save(state, rank_file)
    expected = (np.random.rand(), random.random(), torch.rand(1).item())
    np.random.seed(0)
    loaded = load_rank_state(rank_file)
    set_rng_state(loaded["rng"])
    assert (np.random.rand(), random.random(), torch.rand(1).item()) == expected
    assert loaded["data"] == state["data"]
