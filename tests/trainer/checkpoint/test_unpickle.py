"""No file of a DCP checkpoint is unpickled with code allowed: not its .metadata, not its non-tensor items.

Each attack is first shown to work against DCP's own readers (the marker file
appears and the real value comes back, so nothing looks wrong), then refused
by ours with the marker never created.
"""

from __future__ import annotations

import enum
import io
import pickle
import re
import warnings
from pathlib import Path, PosixPath
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from fsdp_trainer.checkpoint import unpickle
from fsdp_trainer.errors import UnsafeCheckpointError
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from tests.trainer.checkpoint.crafted import plant_in_item, plant_in_metadata


def _state(step: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=0.25)
    model(torch.ones(2, 4)).sum().backward()
    optim.step()
    return {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optim),
        "train": {"step": step},
    }


def _empty_like(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "train": {"step": 0},
    }


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "step-00000007"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(_state(7), checkpoint_id=str(path), no_dist=True)
    return path


def _dcp_load(state: dict[str, Any], path: Path, safe: bool) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        if safe:
            unpickle.load(state, path, no_dist=True)
        else:
            dcp.load(state, checkpoint_id=str(path), no_dist=True)


def test_a_checkpoint_as_dcp_writes_it_loads_as_before(ckpt: Path) -> None:
    saved = _state(7)
    loaded = _empty_like(saved)
    _dcp_load(loaded, ckpt, safe=True)
    assert loaded["train"]["step"] == 7
    for name, tensor in saved["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name
    metadata = unpickle.saved_metadata(ckpt).state_dict_metadata
    assert tuple(metadata["model.weight"].size) == (3, 4)
    assert "optim.param_groups.0.lr" in metadata


def test_a_crafted_metadata_file_is_refused_without_running_it(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    plant_in_metadata(ckpt, marker)
    # DCP's own reader runs it and returns the real metadata: nothing looks wrong.
    assert "model.weight" in dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert marker.exists()
    marker.unlink()

    where = re.escape(str(ckpt / ".metadata"))
    with pytest.raises(UnsafeCheckpointError, match=rf"^{where}: refusing to load it: it names builtins\.eval"):
        unpickle.saved_metadata(ckpt)
    with pytest.raises(UnsafeCheckpointError, match=rf"^{where}: refusing"):
        _dcp_load(_empty_like(_state(7)), ckpt, safe=True)
    assert not marker.exists()


def test_a_crafted_step_item_is_refused_without_running_it(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    plant_in_item(ckpt, "train.step", marker)
    # DCP's default planner runs it and gets the real step back.
    control = _empty_like(_state(7))
    _dcp_load(control, ckpt, safe=False)
    assert control["train"]["step"] == 7 and marker.exists()
    marker.unlink()

    item = re.escape(f"{ckpt} (item train.step)")
    refused = r"refusing to load it: .*GLOBAL (builtins\.)?eval was not an allowed global by default\.\)\. Checkpoint"
    with pytest.raises(UnsafeCheckpointError, match=rf"^{item}: {refused}"):
        _dcp_load(_empty_like(_state(7)), ckpt, safe=True)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"\x80\x04garbage", b"not a pickle at all"])
def test_damaged_metadata_is_damage_not_an_attack(ckpt: Path, content: bytes) -> None:
    (ckpt / ".metadata").write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(ckpt / '.metadata'))}: damaged \("):
        unpickle.saved_metadata(ckpt)


def test_metadata_that_is_no_dcp_metadata_is_damage(ckpt: Path) -> None:
    (ckpt / ".metadata").write_bytes(b"\x80\x04K\x05.")  # the pickle of the int 5
    with pytest.raises(ValueError, match=r"damaged \(a int, not DCP metadata\)"):
        unpickle.saved_metadata(ckpt)


class _EnumsByName(pickle.Pickler):
    """Pickles enum members as ``getattr(EnumClass, "NAME")``, as the trainer image's Python writes them."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def test_metadata_naming_dcps_enum_members_by_getattr_loads(ckpt: Path) -> None:
    """Seen in the e2e run: a checkpoint written in the trainer image named _MEM_FORMAT_ENCODING's member
    through builtins.getattr, and the first allow-list refused every resume there."""
    metadata = pickle.loads((ckpt / ".metadata").read_bytes())
    buffer = io.BytesIO()
    _EnumsByName(buffer).dump(metadata)
    assert b"getattr" in buffer.getvalue()
    (ckpt / ".metadata").write_bytes(buffer.getvalue())
    assert unpickle.saved_metadata(ckpt).state_dict_metadata.keys() == metadata.state_dict_metadata.keys()
    loaded = _empty_like(_state(7))
    _dcp_load(loaded, ckpt, safe=True)
    assert loaded["train"]["step"] == 7


class _Getattr:
    def __init__(self, target: Any, name: str) -> None:
        self.target, self.name = target, name

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        return getattr, (self.target, self.name)


_GETATTRS = [(PosixPath, "unlink"), (PosixPath, "write_text"), (StorageMeta, "__setattr__")]


@pytest.mark.parametrize(("target", "name"), _GETATTRS)
def test_getattr_in_metadata_reaches_only_enum_members(ckpt: Path, target: Any, name: str) -> None:
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Getattr(target, name)))
    where = re.escape(str(ckpt / ".metadata"))
    with pytest.raises(UnsafeCheckpointError, match=rf"^{where}: refusing to load it: it calls getattr\("):
        unpickle.saved_metadata(ckpt)
