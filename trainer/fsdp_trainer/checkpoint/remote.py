"""The remote tier (``checkpoint.remote: s3://bucket/prefix``): complete checkpoints copied to S3.

The local directory stays the tier where saves are atomic; once a step is
committed there, every rank copies the files it wrote itself to
``<prefix>/step-N/`` from a background thread, so an upload never blocks a
step. S3 has no rename, so the commit point is explicit: each rank writes a
part list (``.parts/rank-R.json``: its objects, sizes and SHA-256) after its
files, and rank 0 writes ``MANIFEST.json``, every object of the step, once
all parts are there. A step without its manifest is never resumed; it is
deleted once a newer step is committed.

Files are staged for upload as hard links (``.upload-*`` in checkpoint.dir),
so pruning the local tier, or a per-node directory dropping its part of an
unshared save, never pulls a file from under an upload.

At start, a node whose local directory lacks the newest committed remote step
downloads it into the local tier (checking every size and checksum), then
resumes from it as from any local checkpoint: resharding and the exact data
position work as they do locally.
"""

from __future__ import annotations

import hashlib
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
from ..s3 import S3Error, S3Location, client, describe
from .layout import RANKS_DIR, STEP_DIR, latest_checkpoint, new_tmp_dir, step_dir_name

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
PARTS_DIR = ".parts"
STAGING_PREFIX = ".upload-"
# DCP's FileSystemWriter names each rank's shard file __<rank>_<n>.distcp.
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_RANK_FILE = re.compile(rf"^{RANKS_DIR}/rank-(\d+)\.pt$")
_FILE_WORKERS = 4
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


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def step_prefix(loc: S3Location, step: int) -> str:
    return loc.key(step_dir_name(step)) + "/"


def remote_steps(s3: Any, loc: S3Location) -> list[int]:
    """Every step with objects under ``loc`` (committed or not), oldest first."""
    steps = []
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=loc.bucket, Prefix=loc.key() + "/" if loc.prefix else "", Delimiter="/"
    )
    for page in pages:
        for common in page.get("CommonPrefixes", []):
            m = STEP_DIR.match(common["Prefix"].rstrip("/").rsplit("/", 1)[-1])
            if m:
                steps.append(int(m.group(1)))
    return sorted(steps)


def read_manifest(s3: Any, loc: S3Location, step: int) -> dict[str, Any] | None:
    """The manifest of ``step``, or None when the step is not committed."""
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=loc.bucket, Key=step_prefix(loc, step) + MANIFEST)["Body"].read()
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise
    return json.loads(body)


def committed_step(remote: str) -> int | None:
    """The newest step committed to ``remote``, or None."""
    loc = S3Location.parse(remote)
    try:
        found = newest_committed(client(), loc)
    except Exception as e:
        raise describe(e, str(loc), "ListObjectsV2") from None
    return found[0] if found is not None else None


def newest_committed(s3: Any, loc: S3Location) -> tuple[int, dict[str, Any]] | None:
    for step in reversed(remote_steps(s3, loc)):
        manifest = read_manifest(s3, loc, step)
        if manifest is not None:
            return step, manifest
    return None


def delete_prefix(s3: Any, bucket: str, prefix: str, first: str | None = None) -> int:
    """Delete every object under ``prefix`` (``first``, a key, before the rest); the count deleted."""
    if first is not None:
        s3.delete_object(Bucket=bucket, Key=first)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True})
    return len(keys) + (first is not None)


def download_step(s3: Any, loc: S3Location, step: int, manifest: dict[str, Any], root: Path) -> Path | None:
    """Copy committed ``step`` into ``root`` (checked against its manifest); the local path, or None if taken.

    Downloads into a ``.tmp-`` directory (start-up deletes it if this is
    interrupted) and renames it into place; when another node sharing the
    directory got there first, its copy stays and this one is dropped.
    """
    final = root / step_dir_name(step)
    tmp = new_tmp_dir(final)
    prefix = step_prefix(loc, step)

    def fetch(entry: dict[str, Any]) -> None:
        target = tmp / entry["key"]
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            s3.download_file(loc.bucket, prefix + entry["key"], str(target))
        except Exception as e:
            raise describe(e, f"s3://{loc.bucket}/{prefix}{entry['key']}", "GetObject") from None
        size = target.stat().st_size
        if size != entry["size"] or sha256(target) != entry["sha256"]:
            raise S3Error(
                f"s3://{loc.bucket}/{prefix}{entry['key']}: {size} bytes whose SHA-256 does not match the manifest "
                f"({entry['size']} bytes): the remote copy of step {step} is damaged"
            )

    tmp.mkdir(parents=True)
    try:
        with ThreadPoolExecutor(_FILE_WORKERS * 2) as pool:
            list(pool.map(fetch, manifest["objects"]))
        os.rename(tmp, final)
    except OSError:
        if final.is_dir():  # another node sharing the directory renamed its copy first
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def fetch_newer(remote: str, root: Path) -> int | None:
    """Download the newest committed remote step into ``root`` when the local tier has nothing as new.

    Run by one process per node; returns the step downloaded, or None.
    """
    loc = S3Location.parse(remote)
    s3 = client()
    try:
        found = newest_committed(s3, loc)
    except S3Error:
        raise
    except Exception as e:
        raise describe(e, str(loc), "ListObjectsV2") from None
    if found is None:
        return None
    step, manifest = found
    local = latest_checkpoint(root)
    if local is not None and local[0] >= step:
        return None
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    path = download_step(s3, loc, step, manifest, root)
    size = sum(o["size"] for o in manifest["objects"])
    if path is not None:
        seconds = time.perf_counter() - t0
        log.info(
            "downloaded step %d from %s (%.1f MB in %.1f s): newer than the local tier (%s)",
            step,
            loc,
            size / 1e6,
            seconds,
            f"step {local[0]}" if local else "empty",
        )
    return step


def clean_remote(remote: str, resume: str) -> str | None:
    """Rank 0 at start: delete the remote steps never committed; a problem line, or None.

    ``resume: never`` on a prefix that holds committed steps is refused: this
    run's saves would overwrite them, step by step.
    """
    loc = S3Location.parse(remote)
    s3 = client()
    try:
        steps = remote_steps(s3, loc)
        committed = [step for step in steps if read_manifest(s3, loc, step) is not None]
        if resume == "never" and committed:
            return (
                f"{loc} already holds committed checkpoints (steps {', '.join(map(str, committed))}) and "
                "checkpoint.resume is never: this run would overwrite them; use another prefix, or delete them first"
            )
        for step in steps:
            if step not in committed:
                delete_prefix(s3, loc.bucket, step_prefix(loc, step))
                log.warning("removed uncommitted remote checkpoint %s/%s", loc, step_dir_name(step))
    except Exception as e:
        raise describe(e, str(loc), "ListObjectsV2") from None
    return None


def probe(remote: str) -> str | None:
    """What ``fsdp-train check`` asks of the remote tier: list it, write and delete an object; a problem, or None."""
    import uuid

    loc = S3Location.parse(remote)
    key = loc.key(f".fsdp-probe-{uuid.uuid4().hex[:12]}")
    steps = [
        ("ListObjectsV2", str(loc), lambda s3: s3.list_objects_v2(Bucket=loc.bucket, Prefix=loc.key(), MaxKeys=1)),
        ("PutObject", f"s3://{loc.bucket}/{key}", lambda s3: s3.put_object(Bucket=loc.bucket, Key=key, Body=b"")),
        ("DeleteObject", f"s3://{loc.bucket}/{key}", lambda s3: s3.delete_object(Bucket=loc.bucket, Key=key)),
    ]
    try:
        s3 = client()
    except Exception as e:
        return str(describe(e, str(loc), "client"))
    for operation, where, call in steps:
        try:
            call(s3)
        except Exception as e:
            return str(describe(e, where, operation))
    return None


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
    uploaded_step: int | None = None  # this rank's newest step whose part is uploaded
    failures: int = 0
    bytes: int = 0
    seconds: float = 0.0
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
        self.loc = S3Location.parse(remote)
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
        self._s3: Any = None
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
                self.loc,
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
                self.loc,
                timeout,
            )
        elif pending:
            log.info("uploads to %s finished", self.loc)
        return done

    # -- the upload thread ------------------------------------------------------

    def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = client()
        return self._s3

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
            while not self._stop.is_set():
                try:
                    self._upload(job)
                    break
                except Exception as e:
                    self._failed(job, e)
            else:
                return
            shutil.rmtree(job.staging, ignore_errors=True)
            with self._lock:
                self.stats.uploaded_step = job.step
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
        log.info("skipped the upload of step %d to %s: %s", job.step, self.loc, why)

    def _failed(self, job: _Job, e: Exception) -> None:
        with self._lock:
            self.stats.failures += 1
            attempts = self.stats.failures
        self._changed()
        error = e if isinstance(e, S3Error) else describe(e, str(self.loc), "upload")
        delay = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** min(attempts, 10))
        log.warning("upload of step %d failed (retrying in %.0f s): %s", job.step, delay, error)
        self._stop.wait(delay)

    def _upload(self, job: _Job) -> None:
        s3 = self._client()
        prefix = step_prefix(self.loc, job.step)
        files = sorted(p.relative_to(job.staging).as_posix() for p in job.staging.rglob("*") if p.is_file())
        t0 = time.perf_counter()

        def put(rel: str) -> dict[str, Any]:
            path = job.staging / rel
            entry = {"key": rel, "size": path.stat().st_size, "sha256": sha256(path)}
            try:
                s3.upload_file(str(path), self.loc.bucket, prefix + rel)
            except Exception as e:
                raise describe(e, f"s3://{self.loc.bucket}/{prefix}{rel}", "PutObject") from None
            return entry

        with ThreadPoolExecutor(_FILE_WORKERS) as pool:
            objects = list(pool.map(put, files))
        maybe_fault("during_upload", job.step, self.rank, self.root)
        part = {"rank": self.rank, "step": job.step, "objects": objects}
        key = f"{prefix}{PARTS_DIR}/rank-{self.rank:05d}.json"
        try:
            s3.put_object(Bucket=self.loc.bucket, Key=key, Body=json.dumps(part).encode())
        except Exception as e:
            raise describe(e, f"s3://{self.loc.bucket}/{key}", "PutObject") from None
        size = sum(o["size"] for o in objects)
        with self._lock:
            self.stats.bytes += size
            self.stats.seconds += time.perf_counter() - t0
        log.info(
            "uploaded step %d of rank %d to %s (%d files, %.1f MB, %.1f s)",
            job.step,
            self.rank,
            self.loc,
            len(objects),
            size / 1e6,
            time.perf_counter() - t0,
        )

    def _commit(self, step: int) -> None:
        """Rank 0: once every rank's part of ``step`` is there, write the manifest, then prune."""
        s3 = self._client()
        prefix = step_prefix(self.loc, step)
        deadline = time.monotonic() + self.commit_wait_seconds
        delay = 0.2
        while True:
            try:
                parts = self._parts(s3, prefix)
            except Exception as e:
                parts = None
                self._failed(_Job(step, Path()), e)
            if parts is not None and len(parts) >= self.world_size:
                break
            newer = self._newest_waiting()
            if newer is not None or self._stop.is_set() or time.monotonic() > deadline:
                have = 0 if parts is None else len(parts)
                log.warning(
                    "step %d not committed to %s: %d of %d ranks' parts uploaded%s",
                    step,
                    self.loc,
                    have,
                    self.world_size,
                    f" (step {newer} is waiting)" if newer is not None else "",
                )
                return
            self._stop.wait(delay)
            delay = min(delay * 2, 5.0)
        objects = [o for p in sorted(parts, key=lambda p: p["rank"]) for o in p["objects"]]
        manifest = {"step": step, "world_size": self.world_size, "time": time.time(), "objects": objects}
        while not self._stop.is_set():
            try:
                s3.put_object(Bucket=self.loc.bucket, Key=prefix + MANIFEST, Body=json.dumps(manifest).encode())
                break
            except Exception as e:
                self._failed(_Job(step, Path()), describe(e, f"s3://{self.loc.bucket}/{prefix}{MANIFEST}", "PutObject"))
        else:
            return
        with self._lock:
            self.stats.committed_step = step
        log.info("checkpoint step %d committed to %s (%d objects)", step, self.loc, len(objects))
        try:
            self._prune(s3, step)
        except Exception as e:  # the next commit prunes again
            log.warning("pruning %s failed: %s", self.loc, describe(e, str(self.loc), "DeleteObjects"))

    def _parts(self, s3: Any, prefix: str) -> list[dict[str, Any]]:
        parts = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=prefix + PARTS_DIR):
            for o in page.get("Contents", []):
                body = s3.get_object(Bucket=self.loc.bucket, Key=o["Key"])["Body"].read()
                parts.append(json.loads(body))
        return parts

    def _prune(self, s3: Any, committed: int) -> None:
        """Keep the newest ``keep_last`` committed steps; delete older ones and uncommitted ones up to ``committed``."""
        kept = 0
        for step in reversed(remote_steps(s3, self.loc)):
            if step > committed:
                continue  # a newer step being uploaded
            prefix = step_prefix(self.loc, step)
            if read_manifest(s3, self.loc, step) is not None:
                kept += 1
                if kept <= self.keep_last:
                    continue
                # The manifest goes first: a step half deleted is then never resumed.
                delete_prefix(s3, self.loc.bucket, prefix, first=prefix + MANIFEST)
                log.info("removed old remote checkpoint %s%s", f"s3://{self.loc.bucket}/", prefix)
            else:
                delete_prefix(s3, self.loc.bucket, prefix)
                log.info("removed uncommitted remote checkpoint %s%s", f"s3://{self.loc.bucket}/", prefix)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.stats)
