"""Distributed checkpoints (torch.distributed.checkpoint) that are atomic and resumable.

Layout of ``checkpoint.dir``::

    step-00000500/            a complete checkpoint
      .metadata, __*.distcp   DCP: model + optimizer (sharded), step
      ranks/rank-00000.pt     per-rank: data position, RNG states
      trainer_config.yaml     the config the run used (for export)
      tokenizer/              the tokenizer (for export)
      COMPLETE                marker, written last (JSON: step, world size, time)
    step-00001000.tmp-<id>/   a save in progress, or one a crash interrupted

A save writes everything into ``step-N.tmp-<id>/``; after a barrier proves every
rank has finished writing, rank 0 writes ``COMPLETE`` and renames the
directory to ``step-N/`` (a rename is atomic on POSIX filesystems, EFS/FSx
included). Resume only considers ``step-N/`` directories with the marker, so a
save interrupted at any point is never loaded; stale ``.tmp-`` directories
are deleted at start-up. With ``asyncSave`` the DCP write runs in the
background and the marker/rename happen when the next save starts or at the
end of training, whichever comes first.

Model and optimizer states go through ``get_state_dict``/``set_state_dict``,
so a checkpoint can be loaded on a different world size or sharding strategy
(DCP reshards); the per-rank data position then cannot be mapped exactly and
the data continues at a fresh epoch (see ``TrainData`` in data/loader.py).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import random
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_api.contract import CHECKPOINT_COMPLETE_MARKER
from fsdp_api.spec import CheckpointSpec, PeftSpec
from fsdp_api.trainer_config import TrainerConfig
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from .errors import CheckpointSaveError, ConfigError, UnloadableCheckpointError, UnsafeCheckpointError, name_list
from .faults import maybe_fault
from .model.param_names import canonical
from .parallel.distributed import WorldInfo, all_ranks, barrier, broadcast_object, max_over_ranks

log = logging.getLogger(__name__)

MARKER = CHECKPOINT_COMPLETE_MARKER
STEP_DIR = re.compile(r"^step-(\d{8})$")
TMP_DIR = re.compile(r"^step-(\d{8})\.tmp-")
RANKS_DIR = "ranks"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = STEP_DIR.match(entry.name)
        if m and entry.is_dir() and (entry / MARKER).is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def remove_stale(root: Path) -> list[Path]:
    """Delete interrupted saves (``.tmp-`` directories); returns what was removed."""
    removed = []
    if root.is_dir():
        for entry in root.iterdir():
            if TMP_DIR.match(entry.name) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


# What a write returns when the checkpoint volume is full (a quota counts as full).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(e: BaseException) -> OSError | None:
    """The full-volume OSError behind ``e``: itself, what it was raised from, or any rank's DCP failure.

    DCP gathers each rank's write error into one CheckpointException whose
    text is every rank's traceback; the errno is what the user needs.
    """
    pending, seen = [e], set()
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return error
        if isinstance(error, CheckpointException):
            pending += [failure for failure, _trace in error.failures.values()]
        pending += [c for c in (error.__cause__, error.__context__) if c is not None]
    return None


def remove_partial(tmp: Path) -> bool:
    """Delete an unfinished save (a ``.tmp-`` directory, never a complete checkpoint); whether it is gone."""
    if not TMP_DIR.match(tmp.name):
        raise ValueError(f"{tmp} is not an unfinished save")
    shutil.rmtree(tmp, ignore_errors=True)  # another rank may be removing it too
    return not tmp.exists()


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# The run's config, saved in every checkpoint (export and the resume check read it).
CONFIG_FILE = "trainer_config.yaml"
# The model's transformers config.json, saved beside it: export rebuilds the architecture from it.
MODEL_CONFIG_DIR = "model_config"
# The model's entry in the DCP state (its tensors are "model.<name>").
MODEL_KEY = "model"


def _saved_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The model tensors of a checkpoint and their full shapes, from DCP's metadata (no data read)."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    prefix = f"{MODEL_KEY}."
    return {
        key[len(prefix) :]: tuple(meta.size)
        for key, meta in metadata.items()
        if key.startswith(prefix) and hasattr(meta, "size")
    }


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


def architecture_changes(saved: dict[str, tuple[int, ...]], model: nn.Module) -> list[str]:
    """What differs between a checkpoint's model tensors and this model's (names and shapes)."""
    current = checkpointed_tensors(model)
    changes = []
    if gone := [n for n in saved if n not in current]:
        changes.append(f"the checkpoint has tensors this model lacks: {name_list(gone)}")
    if new := [n for n in current if n not in saved]:
        changes.append(f"this model has tensors the checkpoint lacks: {name_list(new)}")
    if reshaped := [
        f"{n} {list(saved[n])} -> {list(current[n])}" for n in current if n in saved and saved[n] != current[n]
    ]:
        changes.append(f"shapes differ: {name_list(reshaped)}")
    return changes


class _Unreadable(Exception):
    """A checkpoint's own files cannot be read (not a config problem): try an older one."""


def _peft_of(path: Path) -> tuple[bool, dict[str, Any] | None]:
    """(whether the checkpoint's config could be read, its ``peft`` section)."""
    try:
        saved = TrainerConfig.from_yaml((path / CONFIG_FILE).read_text())
    except Exception:  # absent or unreadable: the tensor check below still guards the resume
        return False, None
    return True, saved.peft.model_dump(by_alias=True, mode="json") if saved.peft else None


def peft_changes(path: Path, peft: PeftSpec | None) -> list[str]:
    """How the checkpoint's LoRA settings differ from this run's (alpha and dropout change no shape)."""
    known, saved = _peft_of(path)
    current = peft.model_dump(by_alias=True, mode="json") if peft else None
    if not known or saved == current:
        return []
    if saved is None or current is None:
        before, now = ("full fine-tuning", "LoRA") if saved is None else ("LoRA", "full fine-tuning")
        return [f"peft: the checkpoint was trained with {before}, this run uses {now}"]
    return [
        f"peft.{key}: the checkpoint was trained with {saved.get(key)!r}, this run has {current.get(key)!r}"
        for key in sorted(set(saved) | set(current))
        if saved.get(key) != current.get(key)
    ]


def check_resumable(path: Path, model: nn.Module, peft: PeftSpec | None = None) -> None:
    """Refuse to resume ``path`` into a model of another architecture (``model``: the meta model).

    DCP loads what it finds by name: with fewer layers it would drop the rest
    and train on, silently. Learning rate, steps, batch settings and the
    sharding strategy may change; the model's tensors may not, nor the LoRA
    settings (``peft``), some of which (alpha, dropout) no tensor shape shows.
    """
    try:
        saved = _saved_shapes(path)
    except Exception as e:  # a truncated or garbage .metadata raises pickle, EOF, OS or value errors
        raise _Unreadable(f"cannot read its metadata: {_first_line(e)}") from None
    changes = peft_changes(path, peft) or architecture_changes(saved, model)
    if changes:
        raise ConfigError(
            [f"model: {change} (checkpoint {path} holds another architecture)" for change in changes]
            + [
                "checkpoint.dir: resuming needs the checkpoint's architecture; restore it, or start fresh "
                "with checkpoint.resume: never or another checkpoint.dir"
            ]
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def resume_candidates(spec: CheckpointSpec, world: WorldInfo) -> list[tuple[int, Path]]:
    """The checkpoints to resume from (``resume: auto``), newest first; empty for a fresh start.

    Rank 0 decides and tells the others, so all ranks try the same ones even
    if a shared filesystem shows them different listings for a moment. Stale
    ``.tmp-`` directories of interrupted saves are deleted first.
    """
    found: list[tuple[int, Path]] = []
    if world.is_main:
        root = Path(spec.dir)
        for path in remove_stale(root):
            log.warning("removed interrupted checkpoint %s", path)
        if spec.resume == "auto":
            found = complete_checkpoints(root)[::-1]
    return broadcast_object(found)  # type: ignore[return-value]


# A checkpoint that cannot be loaded is moved aside under this suffix (never
# deleted: it is evidence, and it may be repairable); resume, keepLast and
# later saves of the same step then no longer see it.
UNLOADABLE_SUFFIX = ".unloadable"


def set_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.unloadable`` (``-2``, ``-3``... if taken); returns the new path."""
    target = path.with_name(path.name + UNLOADABLE_SUFFIX)
    n = 2
    while target.exists():
        target = path.with_name(f"{path.name}{UNLOADABLE_SUFFIX}-{n}")
        n += 1
    path.rename(target)
    _fsync_dir(path.parent)
    return target


@dataclass(frozen=True)
class Skipped:
    """A checkpoint resume passed over, and why."""

    step: int
    path: Path
    reason: str


def check_candidates(
    candidates: list[tuple[int, Path]], model: nn.Module, world: WorldInfo, peft: PeftSpec | None = None
) -> tuple[list[tuple[int, Path]], list[Skipped]]:
    """Check every candidate's metadata against ``model`` (the meta model): (loadable ones, unreadable ones).

    Reading metadata is cheap (no tensor data), so all are checked before
    anything is materialised. The newest readable one of another
    architecture is a config error (ConfigError): an older checkpoint would
    not fix that. Older ones of another architecture (from before a fresh
    start in the same directory) are never loaded. All ranks read and agree.
    """
    usable: list[tuple[int, Path]] = []
    unreadable: list[Skipped] = []
    for step, path in candidates:
        reason, changed = None, None
        try:
            check_resumable(path, model, peft)
        except _Unreadable as e:
            reason = str(e)
        except ConfigError as e:
            changed = e
        if not all_ranks(reason is None, world):
            unreadable.append(Skipped(step, path, reason or "another rank cannot read its metadata"))
        elif changed is not None:
            if not usable:
                raise changed
            log.warning("checkpoint %s holds another architecture; it is never loaded", path)
        else:
            usable.append((step, path))
    return usable, unreadable


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
_RANK_STATE_GLOBALS = [np.ndarray, np.dtype, np.dtypes.UInt32DType, np._core.multiarray._reconstruct]


# What torch's weights-only unpickler says when a file tries to import or call
# something (torch/_weights_only_unpickler.py: "unsupported GLOBAL", "Unsupported
# global: GLOBAL", "Trying to call reduce for unrecognized function", "Can only
# create new object", "Can only build"). Any other unpickling error (an unknown
# opcode, a short string) is damage, not an attack.
_CODE_MARKERS = ("GLOBAL", "call reduce", "create new object", "Can only build")


def load_rank_state(path: Path) -> dict[str, Any]:
    """A per-rank state file, read with ``weights_only`` and the numpy allow-list above.

    UnsafeCheckpointError when it tries to run or build code; ValueError when
    it is merely damaged (resume then falls back to an older checkpoint).
    """
    try:
        with torch.serialization.safe_globals(_RANK_STATE_GLOBALS):
            state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        lines = [line for line in text.strip().splitlines() if line.strip()]
        detail = next((line.strip() for line in lines if any(m in line for m in _CODE_MARKERS)), None)
        if detail is None:
            # torch wraps the unpickler's own words in advice: take the line after "WeightsUnpickler error:".
            marker = next((i for i, line in enumerate(lines) if "WeightsUnpickler error" in line), None)
            found = lines[marker + 1].strip() if marker is not None and marker + 1 < len(lines) else type(e).__name__
            raise ValueError(f"{path}: damaged ({found})") from None
        raise UnsafeCheckpointError(
            f"{path}: refusing to load it: it holds more than tensors, numbers and strings ({detail}). "
            "Checkpoint files are data; whoever can write the checkpoint volume could otherwise run code here"
        ) from None
    except Exception as e:
        # Bytes that are no pickle at all fail inside torch.load's own parsing before
        # the unpickler judges them (an IndexError, a KeyError, a UnicodeDecodeError,
        # "Invalid magic number", a zip without its central directory): damage too.
        raise ValueError(f"{path}: damaged ({_first_line(e)})") from None
    if not isinstance(state, dict):
        raise UnsafeCheckpointError(f"{path}: not a rank state (a {type(state).__name__}, not a mapping)")
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@dataclass
class _Pending:
    """A save whose shards are written (or being written) but not yet marked complete."""

    step: int
    tmp: Path
    future: Future | None


class Checkpointer:
    """Saves and restores everything a run needs to continue exactly."""

    def __init__(
        self,
        spec: CheckpointSpec,
        world: WorldInfo,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Any,
        write_assets: Callable[[Path], None] | None = None,
    ) -> None:
        self.spec, self.world = spec, world
        self.root = Path(spec.dir)
        self.model, self.optimizer, self.data = model, optimizer, data
        self.write_assets = write_assets
        self._pending: _Pending | None = None
        # Bytes of the newest checkpoint this process committed (rank 0 commits; None elsewhere).
        self.last_size_bytes: int | None = None
        # Async saves run collectives from a background thread: they get their
        # own gloo group so they never interleave with the training's.
        self._async_group = dist.new_group(backend="gloo") if spec.async_save else None

    # -- what is saved --------------------------------------------------------

    def _dcp_state(self, step: int) -> dict[str, Any]:
        return {
            MODEL_KEY: ModelState(self.model),
            "optim": OptimizerState(self.model, self.optimizer),
            # The LR schedule is a function of the step (optim.restore_schedule).
            "train": {"step": step},
        }

    def _rank_file(self, ckpt: Path) -> Path:
        return ckpt / RANKS_DIR / f"rank-{self.world.rank:05d}.pt"

    # -- saving ---------------------------------------------------------------

    def due(self, step: int, max_steps: int) -> bool:
        return step % self.spec.interval_steps == 0 or step == max_steps

    def save(self, step: int) -> float:
        """Write a checkpoint of ``step``; returns the seconds this rank was blocked."""
        t0 = time.perf_counter()
        self.finalize()
        final = self.root / step_dir_name(step)
        tmp = Path(str(broadcast_object(f"{final}.tmp-{uuid.uuid4().hex[:8]}" if self.world.is_main else None)))
        with self._disk_full_is_one_line(step, tmp):
            rank_file = self._rank_file(tmp)
            rank_file.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"step": step, "data": self.data.state_dict(), "rng": rng_state()}, rank_file)
            if self.world.is_main and self.write_assets is not None:
                self.write_assets(tmp)
            state = self._dcp_state(step)
            if self.spec.async_save:
                future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group)
                self._pending = _Pending(step, tmp, future)
                return time.perf_counter() - t0
            dcp.save(state, checkpoint_id=str(tmp))
        self._pending = _Pending(step, tmp, None)
        self.finalize()
        return time.perf_counter() - t0

    def finalize(self) -> None:
        """Mark the pending save complete once every rank has written its part."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        with self._disk_full_is_one_line(pending.step, pending.tmp):
            if pending.future is not None:
                pending.future.result()  # an async save's write error surfaces here
            maybe_fault("during_save", pending.step, self.world.rank, self.root)
            barrier(self.world)
            if self.world.is_main:
                self._commit(pending)
        # Nobody may look for this checkpoint (or save the next) before it exists.
        barrier(self.world)

    @contextmanager
    def _disk_full_is_one_line(self, step: int, tmp: Path) -> Iterator[None]:
        """A full volume while saving ``step`` into ``tmp``: CheckpointSaveError, the partial save deleted.

        Deleting it gives back the space it took, so the next save can fit
        after a restart; it was never complete, so it could not be resumed
        anyway. Complete checkpoints are never deleted to make room: the
        newest one is what the restart resumes from. Other errors pass
        through unchanged (start-up removes the partial save).
        """
        try:
            yield
        except CheckpointSaveError:
            raise
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            full = disk_full_error(e)
            if full is None:
                raise
            partial = "was removed" if remove_partial(tmp) else "could not be removed"
            raise CheckpointSaveError(
                f"checkpoint.dir {self.root}: cannot save the checkpoint of step {step}: "
                f"{os.strerror(full.errno or errno.ENOSPC)}. The partial {tmp.name} {partial} and older "
                "checkpoints were kept; free space on the checkpoint volume (or make it larger), then restart "
                "to resume from the newest complete checkpoint"
            ) from None

    def _commit(self, pending: _Pending) -> None:
        marker = {"step": pending.step, "world_size": self.world.world_size, "time": time.time()}
        with open(pending.tmp / MARKER, "w") as f:
            json.dump(marker, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(pending.tmp)
        final = self.root / step_dir_name(pending.step)
        if final.exists():
            # A fresh run (resume: never) re-saving a step of an older run.
            shutil.rmtree(final)
        pending.tmp.rename(final)
        _fsync_dir(self.root)
        self.last_size_bytes = directory_bytes(final)
        log.info("checkpoint step %d saved to %s (%.1f MB)", pending.step, final, self.last_size_bytes / 1e6)
        self._prune()

    def _prune(self) -> None:
        complete = complete_checkpoints(self.root)
        for _, path in complete[: max(0, len(complete) - self.spec.keep_last)]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s", path)

    # -- resuming -------------------------------------------------------------

    def resume(self, candidates: list[tuple[int, Path]], skipped: list[Skipped]) -> tuple[int, float, list[Skipped]]:
        """Load the newest of ``candidates`` (checked, newest first) that every rank can load.

        Returns (step, seconds, every skipped checkpoint: ``skipped``, whose
        metadata could not be read, and the ones that failed here).

        A checkpoint that fails to load on any rank (a truncated shard, a
        garbage rank file) is skipped for the next older one. Once one loads,
        rank 0 sets the skipped ones aside (``.unloadable``); if none loads,
        nothing is renamed and UnloadableCheckpointError names them all.
        An unsafe rank file (UnsafeCheckpointError) stops the run instead.
        """
        skipped = list(skipped)
        ok, failed, unsafe = 0, 1, 2
        for step, path in candidates:
            error: BaseException | None = None
            outcome = ok
            try:
                seconds = self.load(path)
            except UnsafeCheckpointError as e:
                error, outcome = e, unsafe
            except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
                error, outcome = e, failed
            # Every rank takes part whatever happened to it: one rank's bad file is everyone's decision.
            worst = max_over_ranks(outcome, self.world)
            if worst == unsafe:
                if isinstance(error, UnsafeCheckpointError):
                    raise error
                raise UnsafeCheckpointError(f"{path}: another rank refused its state file as unsafe")
            if worst == ok:
                if self.world.is_main:
                    for s in skipped:
                        moved = set_aside(s.path)
                        log.warning("checkpoint %s could not be loaded (%s); moved to %s", s.path, s.reason, moved)
                return step, seconds, skipped
            reason = _first_line(error) if error is not None else "another rank could not load its part"
            log.warning("checkpoint %s could not be loaded on rank %d: %s", path, self.world.rank, reason)
            skipped.append(Skipped(step, path, reason))
        raise UnloadableCheckpointError(
            f"no checkpoint under {self.root} can be loaded: "
            + "; ".join(f"{s.path.name}: {s.reason}" for s in skipped)
            + ". Nothing was renamed or deleted; move them aside (or set checkpoint.resume: never) to start fresh"
        )

    def load(self, path: Path) -> float:
        """Restore model, optimizer, data position and RNG from ``path``; returns the seconds taken."""
        t0 = time.perf_counter()
        state = self._dcp_state(0)
        dcp.load(state, checkpoint_id=str(path))
        step = int(state["train"]["step"])
        if f"{step:08d}" not in path.name:
            raise RuntimeError(f"{path} holds step {step}, not the step its name says")
        rank_file = self._rank_file(path)
        if rank_file.is_file():
            extra = load_rank_state(rank_file)
            set_rng_state(extra["rng"])
        else:
            # The world grew: no state for this rank. Rank 0's tells the data
            # which epoch it was in (TrainData moves on to the next one).
            log.warning("%s has no state for rank %d (the world size changed)", path, self.world.rank)
            extra = load_rank_state(path / RANKS_DIR / "rank-00000.pt")
        self.data.load_state_dict(extra["data"])
        log.info("resumed from %s at step %d", path, step)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.finalize()
        if self._async_group is not None:
            dist.destroy_process_group(self._async_group)
            self._async_group = None
