"""The remote tier's uploads (``checkpoint.remote``): each rank's files of a committed step, in the background.

The local directory stays the tier where saves are atomic; once a step is
committed there, every rank copies the files it wrote itself to
``<prefix>/step-N/`` from a background thread, so an upload never blocks a
step, then its part list; rank 0 writes the manifest once every part is there
and prunes the remote tier (``remote_store.py`` has the layout).

Files are staged for upload as hard links (``.upload-*`` in checkpoint.dir),
so pruning the local tier, or a per-node directory dropping its part of an
unshared save, never pulls a file from under an upload.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..faults import maybe_fault
from ..storage import StoreError, delete_prefix, open_store
from .layout import RANKS_DIR, step_dir_name
from .remote_store import MANIFEST, PARTS_DIR, read_manifest, remote_steps, sha256, step_prefix

log = logging.getLogger(__name__)

STAGING_PREFIX = ".upload-"
# DCP's FileSystemWriter names each rank's shard file __<rank>_<n>.distcp.
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_RANK_FILE = re.compile(rf"^{RANKS_DIR}/rank-(\d+)\.pt$")
# Files of one rank uploaded at once (the S3 store sends each large one in 8 MiB parts, itself in parallel).
_UPLOAD_WORKERS = 4
# Backoff between attempts of a failed upload: doubling, capped.
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0


def owner(relpath: str) -> int:
    """The rank that wrote ``relpath`` of a checkpoint: its shard and rank files are its own, the rest rank 0's."""
    name = relpath.rsplit("/", 1)[-1]
    m = _SHARD.match(name) or _RANK_FILE.match(relpath)
    return int(m.group(1)) if m else 0


def own_files(ckpt: Path, rank: int, world_size: int) -> list[str]:
    """Relative paths (POSIX) of the files under ``ckpt`` that ``rank`` uploads: the ones it wrote.

    A checkpoint resumed on a smaller world has files of ranks that are gone:
    rank 0 takes those.
    """
    found = []
    for path in ckpt.rglob("*"):
        if path.is_file():
            rel = path.relative_to(ckpt).as_posix()
            writer = owner(rel)
            if (writer if writer < world_size else 0) == rank:
                found.append(rel)
    return sorted(found)


def remove_staging(root: Path) -> None:
    """Delete upload staging left by a process that ended before its uploads did."""
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.startswith(STAGING_PREFIX) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)


@dataclass
class UploadStats:
    """What the uploads did so far, for the metrics (read from the training thread)."""

    committed_step: int | None = None  # rank 0: the newest step whose manifest is written
    failures: int = 0
    bytes: int = 0
    queued: list[int] = field(default_factory=list)


@dataclass
class _Job:
    step: int
    staging: Path


class RemoteTier:
    """This rank's uploads to ``checkpoint.remote``, in a background thread."""

    def __init__(
        self,
        remote: str,
        keep_last: int,
        root: Path,
        rank: int,
        world_size: int,
        on_change: Callable[[UploadStats], None] | None = None,
        commit_wait_seconds: float = 600.0,
    ) -> None:
        self.store = open_store(remote)
        self.keep_last, self.root = keep_last, root
        self.rank, self.world_size = rank, world_size
        self.on_change = on_change
        self.commit_wait_seconds = commit_wait_seconds
        self.stats = UploadStats()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._cut_at = float("inf")
        self._last_enqueued: int | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
        self._thread.start()

    # -- the training thread ----------------------------------------------------

    def enqueue(self, step: int, ckpt: Path, *, wrote: bool = False) -> None:
        """Stage this rank's files of the committed ``step`` (in ``ckpt``) and queue their upload.

        ``wrote``: this rank saved the step, so its own rank file must be among
        them; a part without it would commit a step that cannot be resumed.
        """
        staging = self.root / f"{STAGING_PREFIX}{step_dir_name(step)}-rank-{self.rank:05d}"
        shutil.rmtree(staging, ignore_errors=True)
        files = own_files(ckpt, self.rank, self.world_size)
        if wrote and f"{RANKS_DIR}/rank-{self.rank:05d}.pt" not in files:
            raise RuntimeError(f"checkpoint.remote: rank {self.rank}'s files of step {step} are not in {ckpt}")
        for rel in files:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(ckpt / rel, target)
        staging.mkdir(parents=True, exist_ok=True)  # a rank that wrote nothing still reports its (empty) part
        with self._lock:
            self.stats.queued.append(step)
        self._last_enqueued = step
        self._queue.put(_Job(step, staging))

    def cut_wait(self, seconds: float) -> None:
        """Let a wait in ``close`` last at most ``seconds`` more (SIGTERM arrived: the grace period counts)."""
        self._cut_at = min(self._cut_at, time.monotonic() + seconds)

    def lag_steps(self, local_step: int) -> int:
        """Steps committed locally but not yet remotely (rank 0's view)."""
        committed = self.stats.committed_step
        return local_step - committed if committed is not None else local_step

    def close(self, timeout: float) -> bool:
        """Let queued uploads finish for up to ``timeout`` seconds; whether everything was committed."""
        pending = list(self.stats.queued)
        if pending:
            log.info(
                "waiting up to %.0f s for the upload of step(s) %s to %s",
                timeout,
                ", ".join(map(str, pending)),
                self.store,
            )
        self._queue.put(None)
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < min(deadline, self._cut_at):
            self._thread.join(0.2)
        done = not self._thread.is_alive()
        if done and self.rank == 0 and self._last_enqueued is not None:
            done = self.stats.committed_step == self._last_enqueued
        if not done:
            self._stop.set()
            log.warning(
                "step %s was not committed to %s within %.0f s; the local tier has it",
                self._last_enqueued,
                self.store,
                timeout,
            )
        elif pending:
            log.info("uploads to %s finished", self.store)
        return done

    # -- the upload thread ------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            # A newer step waiting behind this one makes it moot: upload only the newest.
            newer = self._newest_waiting()
            if newer is not None and newer > job.step:
                self._drop(job, f"step {newer} is waiting")
                continue
            attempt = 0
            while not self._stop.is_set():
                try:
                    self._upload(job)
                    break
                except Exception as e:
                    attempt += 1
                    self._failed(job.step, e, attempt)
            else:
                return
            shutil.rmtree(job.staging, ignore_errors=True)
            with self._lock:
                if job.step in self.stats.queued:
                    self.stats.queued.remove(job.step)
            if self.rank == 0:
                self._commit(job.step)
            self._changed()

    def _newest_waiting(self) -> int | None:
        with self._queue.mutex:
            steps = [j.step for j in self._queue.queue if j is not None]
        return max(steps) if steps else None

    def _drop(self, job: _Job, why: str) -> None:
        shutil.rmtree(job.staging, ignore_errors=True)
        with self._lock:
            if job.step in self.stats.queued:
                self.stats.queued.remove(job.step)
        log.info("skipped the upload of step %d to %s: %s", job.step, self.store, why)

    def _failed(self, step: int, e: Exception, attempt: int) -> None:
        """Count a failed attempt and wait before the next: the backoff doubles per attempt of this call."""
        with self._lock:
            self.stats.failures += 1
        self._changed()
        error = e if isinstance(e, StoreError) else f"{self.store}: upload: {type(e).__name__} ({e})"
        delay = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** min(attempt - 1, 10))
        log.warning("upload of step %d failed (retrying in %.0f s): %s", step, delay, error)
        self._stop.wait(delay)

    def _upload(self, job: _Job) -> None:
        prefix = step_prefix(self.store, job.step)
        files = sorted(p.relative_to(job.staging).as_posix() for p in job.staging.rglob("*") if p.is_file())
        t0 = time.perf_counter()

        def put(rel: str) -> dict[str, Any]:
            path = job.staging / rel
            entry = {"key": rel, "size": path.stat().st_size, "sha256": sha256(path)}
            self.store.upload(path, prefix + rel)
            return entry

        with ThreadPoolExecutor(_UPLOAD_WORKERS) as pool:
            objects = list(pool.map(put, files))
        maybe_fault("during_upload", job.step, self.rank, self.root)
        part = {"rank": self.rank, "step": job.step, "objects": objects}
        self.store.put(f"{prefix}{PARTS_DIR}/rank-{self.rank:05d}.json", json.dumps(part).encode())
        size = sum(o["size"] for o in objects)
        with self._lock:
            self.stats.bytes += size
        log.info(
            "uploaded step %d of rank %d to %s (%d files, %.1f MB, %.1f s)",
            job.step,
            self.rank,
            self.store,
            len(objects),
            size / 1e6,
            time.perf_counter() - t0,
        )

    def _commit(self, step: int) -> None:
        """Rank 0: once every rank's part of ``step`` is there, write the manifest, then prune."""
        prefix = step_prefix(self.store, step)
        deadline = time.monotonic() + self.commit_wait_seconds
        delay, attempt = 0.2, 0
        while True:
            try:
                parts = self._parts(prefix)
            except Exception as e:
                parts, attempt = None, attempt + 1
                self._failed(step, e, attempt)
            if parts is not None and len(parts) >= self.world_size:
                break
            newer = self._newest_waiting()
            if newer is not None or self._stop.is_set() or time.monotonic() > deadline:
                have = 0 if parts is None else len(parts)
                log.warning(
                    "step %d not committed to %s: %d of %d ranks' parts uploaded%s",
                    step,
                    self.store,
                    have,
                    self.world_size,
                    f" (step {newer} is waiting)" if newer is not None else "",
                )
                return
            self._stop.wait(delay)
            delay = min(delay * 2, 5.0)
        objects = [o for p in sorted(parts, key=lambda p: p["rank"]) for o in p["objects"]]
        manifest = {"step": step, "world_size": self.world_size, "time": time.time(), "objects": objects}
        attempt = 0
        while not self._stop.is_set():
            try:
                self.store.put(prefix + MANIFEST, json.dumps(manifest).encode())
                break
            except Exception as e:
                attempt += 1
                self._failed(step, e, attempt)
        else:
            return
        with self._lock:
            self.stats.committed_step = step
        log.info("checkpoint step %d committed to %s (%d objects)", step, self.store, len(objects))
        try:
            self._prune(step)
        except Exception as e:  # the next commit prunes again
            log.warning("pruning %s failed: %s", self.store, e)

    def _parts(self, prefix: str) -> list[dict[str, Any]]:
        bodies = [self.store.get(o.key) for o in self.store.list(prefix + PARTS_DIR)]
        return [json.loads(body) for body in bodies if body is not None]

    def _prune(self, committed: int) -> None:
        """Keep the newest ``keep_last`` committed steps; delete older ones and uncommitted ones up to ``committed``."""
        kept = 0
        for step in reversed(remote_steps(self.store)):
            if step > committed:
                continue  # a newer step being uploaded
            prefix = step_prefix(self.store, step)
            if read_manifest(self.store, step) is not None:
                kept += 1
                if kept <= self.keep_last:
                    continue
                # The manifest goes first: a step half deleted is then never resumed.
                delete_prefix(self.store, prefix, first=prefix + MANIFEST)
                log.info("removed old remote checkpoint %s", self.store.where(prefix))
            else:
                delete_prefix(self.store, prefix)
                log.info("removed uncommitted remote checkpoint %s", self.store.where(prefix))

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.stats)
