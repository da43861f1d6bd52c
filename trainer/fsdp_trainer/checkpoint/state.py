"""What a checkpoint holds: the model and optimizer (DCP, sharded), the step, and each rank's own state.

Model and optimizer states go through ``get_state_dict``/``set_state_dict``,
so a checkpoint can be loaded on a different world size or sharding strategy
(DCP reshards). Each rank's data position and RNG states go to a per-rank
file (``layout.rank_file``), read back as data (``unpickle.py``).
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from ..errors import UnsafeCheckpointError
from ..model.param_names import canonical
from .unpickle import load_weights_only

# The model's entry in the DCP state (its tensors are "model.<name>").
MODEL_KEY = "model"


def has_frozen(model: nn.Module) -> bool:
    """Whether some weights are frozen (LoRA's base): checkpoints then hold only the trainable ones."""
    return any(not p.requires_grad for p in model.parameters())


def checkpointed_tensors(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The model tensors a checkpoint of this model holds, by name, with their full shapes.

    Everything in the state dict, or with frozen weights only the trainable
    parameters: the frozen base comes from ``model.pretrained`` (or the seed)
    at every start, so saving it again would only make checkpoints large.
    """
    if has_frozen(model):
        return {canonical(n): tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    return {canonical(k): tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}


class ModelState(Stateful):
    """The model's sharded state dict, produced lazily when DCP asks for it.

    With frozen weights (LoRA) only the trainable parameters: frozen ones are
    left out by ``ignore_frozen_params``, and the filter drops what still
    comes through under a second name (a tied output head).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.trainable_only = has_frozen(model)

    def state_dict(self) -> dict[str, Any]:
        if not self.trainable_only:
            return get_model_state_dict(self.model)
        state = get_model_state_dict(self.model, options=StateDictOptions(ignore_frozen_params=True))
        keep = checkpointed_tensors(self.model)
        return {k: v for k, v in state.items() if canonical(k) in keep}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.trainable_only:
            set_model_state_dict(self.model, state_dict)
            return
        # DCP has already refused a checkpoint lacking any key of state_dict():
        # strict=False only lets the frozen weights (not in it) keep their values.
        options = StateDictOptions(strict=False, ignore_frozen_params=True)
        set_model_state_dict(self.model, state_dict, options=options)


class OptimizerState(Stateful):
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


# What the per-rank files hold besides tensors, numbers and strings: numpy's RNG
# state, an array. Unpickling allows these (array reconstruction) and nothing
# else, so a crafted file on the checkpoint volume cannot run code on resume.
_RANK_STATE_GLOBALS = [np.ndarray, np.dtype, np.dtypes.UInt32DType, _reconstruct]


def load_rank_state(path: Path) -> dict[str, Any]:
    """A per-rank state file, read weights-only with the numpy allow-list above.

    UnsafeCheckpointError when it tries to run or build code; ValueError when
    it is merely damaged (resume then falls back to an older checkpoint).
    """
    state = load_weights_only(path, str(path), _RANK_STATE_GLOBALS)
    if not isinstance(state, dict):
        raise UnsafeCheckpointError(f"{path}: not a rank state (a {type(state).__name__}, not a mapping)")
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def dcp_state(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    """The DCP state of a checkpoint: loading fills it in place (``step`` then holds the saved one)."""
    return {
        MODEL_KEY: ModelState(model),
        "optim": OptimizerState(model, optimizer),
        # The LR schedule is a function of the step (optim.restore_schedule).
        "train": {"step": step},
    }


def rank_state(step: int, data: Any) -> dict[str, Any]:
    """This rank's own part: the data position and the RNG states."""
    return {"step": step, "data": data.state_dict(), "rng": rng_state()}


def write_rank_state(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` of a rank's small state, through Python's own write.

    Straight onto a file, torch's zip writer reports a full volume as
    RuntimeError ("unexpected pos") without the errno; the save would then
    have to ask the volume, and another rank may already have freed the
    space. Python's write raises OSError(ENOSPC) itself.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(buffer.getbuffer())
