"""When to save, what to keep and where to resume: the ``Checkpointer``.

A save writes everything into a ``.tmp-`` directory (``layout``); after a
barrier proves every rank has finished writing, rank 0 commits it (marker,
then an atomic rename) and prunes to ``keepLast``. Resume only considers
complete checkpoints, so a save interrupted at any point is never loaded;
stale ``.tmp-`` directories are deleted at start-up. With ``asyncSave`` the
DCP write runs in the background and the commit happens when the next save
starts or at the end of training, whichever comes first.

A checkpoint loaded on another world size cannot map the per-rank data
position exactly; the data continues at a fresh epoch (see ``TrainData`` in
data/loader.py).

With ``checkpoint.remote`` each committed save is also uploaded to S3 in the
background (``remote.py``), and at start a node whose local directory lacks
the newest step committed there downloads it first.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_api.spec import CheckpointSpec
from fsdp_api.trainer_config import JobInfo
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointSaveError, ConfigError, UnloadableCheckpointError, UnsafeCheckpointError, first_line
from ..faults import maybe_fault
from ..parallel.distributed import (
    WorldInfo,
    all_ranks,
    barrier,
    broadcast_object,
    max_over_ranks,
    true_on_every_rank,
)
from ..storage import StoreError
from . import remote as remote_tier
from . import remote_store, unpickle
from .compatibility import Skipped
from .layout import (
    MARKER,
    TMP_DIR,
    TMP_INFIX,
    commit,
    complete_checkpoints,
    directory_bytes,
    new_tmp_dir,
    rank_file,
    remove_partial,
    remove_stale,
    set_aside,
    step_dir_name,
)
from .ownership import directory_conflicts
from .state import dcp_state, load_rank_state, rank_state, set_rng_state, write_rank_state

log = logging.getLogger(__name__)


# What a write returns when the checkpoint volume is full (a quota counts as full).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


# Free space below which a failed save is put down to a full volume: torch.save's zip
# writer reports a failed write as RuntimeError ("iostream error", "unexpected pos"),
# without the errno, so the volume itself is asked. A write that fails for lack of
# space leaves next to nothing free: it writes what fits first.
NEARLY_FULL_BYTES = 16 << 20
NEARLY_FULL_FRACTION = 0.001


def volume_full(path: Path) -> OSError | None:
    """ENOSPC when the volume holding ``path`` is (nearly) full, else None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if free >= max(NEARLY_FULL_BYTES, NEARLY_FULL_FRACTION * total):
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


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


def resume_candidates(spec: CheckpointSpec, world: WorldInfo, job: JobInfo) -> list[tuple[int, Path]]:
    """The checkpoints to resume from (``resume: auto``), newest first; empty for a fresh start.

    Rank 0 decides and tells the others, so all ranks try the same ones even
    if a shared filesystem shows them different listings for a moment. Stale
    ``.tmp-`` directories of interrupted saves are deleted first. A directory
    this run may not use (``ownership.py``) is a ConfigError on every rank.
    """
    found: list[tuple[int, Path]] = []
    conflicts: list[str] = []
    if spec.remote is not None:
        conflicts = prepare_remote(spec, world, job)
    if world.is_main and not conflicts:
        root = Path(spec.dir)
        for path in remove_stale(root):
            log.warning("removed interrupted checkpoint %s", path)
        conflicts = directory_conflicts(root, spec.resume, job)
        if spec.resume == "auto":
            found = complete_checkpoints(root)[::-1]
    found, conflicts = broadcast_object((found, conflicts))
    if conflicts:
        raise ConfigError(conflicts)
    # Rank 0 named the steps; each rank reads them in its own checkpoint.dir (its node's
    # directory: the same path on every pod of a cluster, another path per node on one host).
    found = [(step, Path(spec.dir) / path.name) for step, path in found]
    if spec.remote is not None:
        # Nodes with directories of their own (emptyDirs) hold only their own shards of a
        # save; only a step every node has in full (one it downloaded) can be resumed.
        everywhere = true_on_every_rank([(path / MARKER).is_file() for _, path in found], world)
        found = [candidate for candidate, ok in zip(found, everywhere, strict=True) if ok]
    return found


def prepare_remote(spec: CheckpointSpec, world: WorldInfo, job: JobInfo) -> list[str]:
    """Before resume: clean the remote prefix, and fetch its newest step on every node that lacks it.

    Returns the configuration problems (the same on every rank). Rank 0 deletes
    the steps that were never committed (an upload a crash cut short: their
    parts could mix with this run's), and refuses ``resume: never`` on a prefix
    that holds committed steps: this run would overwrite them. One process per
    node then downloads the newest committed step when its local directory has
    nothing as new; a directory shared by the nodes keeps the first copy.
    """
    assert spec.remote is not None
    root = Path(spec.dir)
    problem: str | None = None
    if world.is_main:
        try:
            problem = remote_store.clean_remote(spec.remote, spec.resume, job)
        except StoreError as e:
            problem = str(e)
    problem = broadcast_object(problem)
    if problem:
        return [f"checkpoint.remote: {problem}"]
    error: str | None = None
    if world.local_rank == 0:
        remote_tier.remove_staging(root)
        if spec.resume == "auto":
            try:
                remote_store.fetch_newer(spec.remote, root)
            except (StoreError, OSError) as e:
                error = first_line(e)
                log.error("checkpoint.remote: %s", error)
    if all_ranks(error is None, world):
        return []
    return [f"checkpoint.remote: {error or 'another node could not download the newest checkpoint'}"]


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
        self._async_group: dist.ProcessGroup | None = None
        if spec.async_save:
            group = dist.new_group(backend="gloo")
            assert isinstance(group, dist.ProcessGroup)  # a group of every rank leaves none out
            self._async_group = group
        self.remote = (
            remote_tier.RemoteTier(spec.remote, spec.remote_keep_last, self.root, world.rank, world.world_size)
            if spec.remote is not None
            else None
        )
        self.last_local_step: int | None = None
        # An emptyDir per pod and several nodes: no directory holds a whole save.
        self.per_node_directories = spec.claim_name is None and world.num_nodes > 1

    # -- saving ---------------------------------------------------------------

    def due(self, step: int, max_steps: int) -> bool:
        return step % self.spec.interval_steps == 0 or step == max_steps

    def save(self, step: int) -> float:
        """Write a checkpoint of ``step``; returns the seconds this rank was blocked."""
        t0 = time.perf_counter()
        self.finalize()
        final = self.root / step_dir_name(step)
        tmp = Path(str(broadcast_object(str(new_tmp_dir(final)) if self.world.is_main else None)))
        with self._disk_full_is_one_line(step, tmp):
            own = rank_file(tmp, self.world.rank)
            own.parent.mkdir(parents=True, exist_ok=True)
            write_rank_state(own, rank_state(step, self.data))
            if self.world.is_main and self.write_assets is not None:
                self.write_assets(tmp)
            state = dcp_state(self.model, self.optimizer, step)
            if self.spec.async_save:
                future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group)
                # The default stager copies synchronously: async_save returns the upload's Future (an
                # AsyncSaveResponse only comes with an asynchronous stager).
                assert isinstance(future, Future)
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
        self.last_local_step = pending.step
        if self.remote is not None:
            self._upload(pending)

    def _upload(self, pending: _Pending) -> None:
        """Queue this rank's files of the committed ``pending`` save for the remote tier.

        With directories of their own per node (an emptyDir and several
        nodes), each node holds only its own ranks' part of the save: node 0
        the committed step, the others an unrenamed ``.tmp-`` directory. Such a
        part can never be resumed there, so once every rank has staged its
        files (hard links) each node drops it: the step lives in S3, and a
        restart downloads it whole. A claim is a volume the nodes share.
        """
        assert self.remote is not None
        # Beside the save's own path, which is rank 0's: the one every rank wrote to.
        final = pending.tmp.with_name(step_dir_name(pending.step))
        source = pending.tmp if pending.tmp.is_dir() else final
        self.remote.enqueue(pending.step, source, wrote=True)
        barrier(self.world)
        if self.world.local_rank != 0:
            return
        if self.per_node_directories:
            for path in (pending.tmp, final):
                shutil.rmtree(path, ignore_errors=True)
            self._prune()  # the steps this node downloaded
        elif pending.tmp.is_dir():
            remove_partial(pending.tmp)

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
            full = disk_full_error(e) or volume_full(tmp if tmp.exists() else self.root) or self._removed_by_peer(tmp)
            if full is None:
                raise
            partial = "was removed" if remove_partial(tmp) else "could not be removed"
            raise CheckpointSaveError(
                f"checkpoint.dir {self.root}: cannot save the checkpoint of step {step}: "
                f"{os.strerror(full.errno or errno.ENOSPC)}. The partial {tmp.name} {partial} and older "
                "checkpoints were kept; free space on the checkpoint volume (or make it larger), then restart "
                "to resume from the newest complete checkpoint"
            ) from None

    def _removed_by_peer(self, tmp: Path) -> OSError | None:
        """ENOSPC when the partial save is gone but was never committed: a peer found the volume full.

        Only the full-volume path deletes a partial save while the ranks are
        writing it, and the space it gives back hides the full volume from
        this rank's own look (seen under load: one rank's write failed, the
        other had already removed the directory).
        """
        if tmp.exists() or not TMP_DIR.match(tmp.name):
            return None
        final = tmp.with_name(tmp.name.split(TMP_INFIX)[0])
        if any(path == final for _, path in complete_checkpoints(self.root)):
            return None  # committed: whatever failed, failed afterwards
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    def _commit(self, pending: _Pending) -> None:
        marker = {"step": pending.step, "world_size": self.world.world_size, "time": time.time()}
        final = self.root / step_dir_name(pending.step)
        commit(pending.tmp, final, marker)
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
                # Only this training's own: a checkpoint.resumeFrom source is read, never renamed.
                if self.world.is_main:
                    for own in [s for s in skipped if s.path.parent == self.root]:
                        moved = set_aside(own.path)
                        log.warning("checkpoint %s could not be loaded (%s); moved to %s", own.path, own.reason, moved)
                self._upload_resumed(step, path)
                return step, seconds, skipped
            reason = first_line(error) if error is not None else "another rank could not load its part"
            log.warning("checkpoint %s could not be loaded on rank %d: %s", path, self.world.rank, reason)
            skipped.append(Skipped(step, path, reason))
        raise UnloadableCheckpointError(
            f"no checkpoint under {candidates[0][1].parent if candidates else self.root} can be loaded: "
            + "; ".join(f"{s.path.name}: {s.reason}" for s in skipped)
            + ". Nothing was renamed or deleted; move them aside (or set checkpoint.resume: never) to start fresh"
        )

    def _upload_resumed(self, step: int, path: Path) -> None:
        """The resumed step goes to the remote tier too when it is not committed there (an upload cut short).

        Not a ``checkpoint.resumeFrom`` source's step (outside this training's directory): uploaded, it
        would be the newest committed step of this training's tier while being another training's, and
        the tier's owner check would then refuse every restart until this training saved a step of its own.
        """
        self.last_local_step = step
        if self.remote is None:
            return
        assert self.spec.remote is not None  # self.remote exists only with checkpoint.remote
        own, committed = False, None
        if self.world.is_main:  # one decision for every rank: the collective below needs them all
            own = path.parent == self.root
            try:
                committed = remote_store.committed_step(self.spec.remote) if own else None
            except StoreError as e:
                log.warning("checkpoint.remote: %s", e)
        own, committed = broadcast_object((own, committed))
        if own and (committed is None or committed < step):
            log.info("step %d is not committed to %s yet: uploading it", step, self.remote.store)
            self.remote.enqueue(step, path)

    def load(self, path: Path) -> float:
        """Restore model, optimizer, data position and RNG from ``path``; returns the seconds taken."""
        t0 = time.perf_counter()
        state = dcp_state(self.model, self.optimizer, 0)
        unpickle.load(state, path)
        step = int(state["train"]["step"])
        if f"{step:08d}" not in path.name:
            raise RuntimeError(f"{path} holds step {step}, not the step its name says")
        own = rank_file(path, self.world.rank)
        if own.is_file():
            extra = load_rank_state(own)
            set_rng_state(extra["rng"])
        else:
            # The world grew: no state for this rank. Rank 0's tells the data
            # which epoch it was in (TrainData moves on to the next one).
            log.warning("%s has no state for rank %d (the world size changed)", path, self.world.rank)
            extra = load_rank_state(rank_file(path, 0))
        self.data.load_state_dict(extra["data"])
        log.info("resumed from %s at step %d", path, step)
        return time.perf_counter() - t0

    def close(self, remote_wait_seconds: float = 600.0) -> bool:
        """Commit a pending save; with a remote tier, wait up to ``remote_wait_seconds`` for its uploads.

        Returns whether the newest save reached the remote tier (True without one).
        """
        self.finalize()
        uploaded = self.remote.close(remote_wait_seconds) if self.remote is not None else True
        if self._async_group is not None:
            dist.destroy_process_group(self._async_group)
            self._async_group = None
        return uploaded
