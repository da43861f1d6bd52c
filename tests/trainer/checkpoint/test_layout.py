"""The checkpoint package's seams: names from the contract, the atomic commit, what a save holds."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fsdp_api.contract import CHECKPOINT_COMPLETE_MARKER, CHECKPOINT_DIR_PREFIX
from fsdp_trainer.checkpoint import layout, state
from fsdp_trainer.checkpoint import step_dir_name as exported_step_dir_name


def test_step_directories_are_named_with_the_contract_prefix() -> None:
    name = layout.step_dir_name(42)
    assert name == f"{CHECKPOINT_DIR_PREFIX}00000042"
    assert layout.STEP_DIR.match(name).group(1) == "00000042"
    assert layout.MARKER == CHECKPOINT_COMPLETE_MARKER
    assert exported_step_dir_name is layout.step_dir_name


def test_a_new_tmp_dir_is_an_unfinished_save_of_its_step_and_unique(tmp_path: Path) -> None:
    final = tmp_path / layout.step_dir_name(7)
    first, second = layout.new_tmp_dir(final), layout.new_tmp_dir(final)
    assert first != second and first.parent == tmp_path
    assert layout.TMP_DIR.match(first.name).group(1) == "00000007"
    assert layout.STEP_DIR.match(first.name) is None


def test_commit_marks_and_renames_replacing_an_older_run_of_the_step(tmp_path: Path) -> None:
    final = tmp_path / layout.step_dir_name(3)
    (final / "old").mkdir(parents=True)  # a step of an older run (resume: never)
    tmp = layout.new_tmp_dir(final)
    (tmp / layout.RANKS_DIR).mkdir(parents=True)
    layout.commit(tmp, final, {"step": 3, "world_size": 2})
    assert not tmp.exists()
    assert json.loads((final / layout.MARKER).read_text()) == {"step": 3, "world_size": 2}
    assert sorted(p.name for p in final.iterdir()) == [layout.MARKER, layout.RANKS_DIR]
    assert layout.complete_checkpoints(tmp_path) == [(3, final)]


def test_rank_files_live_under_ranks() -> None:
    assert layout.rank_file(Path("/c/step-00000001"), 3) == Path("/c/step-00000001/ranks/rank-00003.pt")


class _Data:
    def state_dict(self) -> dict[str, int]:
        return {"epoch": 1}


def test_a_save_holds_model_optimizer_step_and_each_ranks_data_and_rngs() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dcp = state.dcp_state(model, optimizer, 5)
    assert set(dcp) == {state.MODEL_KEY, "optim", "train"}
    assert dcp["train"] == {"step": 5}
    own = state.rank_state(5, _Data())
    assert (own["step"], own["data"]) == (5, {"epoch": 1})
    assert {"torch", "python", "numpy"} <= set(own["rng"])
