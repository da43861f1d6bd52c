"""The remote tier's layout in an object store and the calls on it (``checkpoint.remote: s3://bucket/prefix``).

A step lives under ``<prefix>/step-N/``: the files of every rank, each rank's
part list (``.parts/rank-R.json``: its objects, sizes and SHA-256), and
``MANIFEST.json``, every object of the step, written last by rank 0: object
stores have no rename, so the manifest is the commit point, and a step without
it is never resumed. Every call goes through the store interface
(``fsdp_trainer.storage``), whichever service holds the prefix. Here:
listing the steps, reading manifests, deleting steps, downloading a
committed step into the local tier (checked against its manifest), the
start-up cleaning, and the config check's probe. The uploads
themselves are ``remote.py``'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fsdp_api.object_keys import UnsafeKey, local_path
from fsdp_api.trainer_config import JobInfo

from ..storage import ObjectStore, StoreError, delete_prefix, open_store
from .layout import CONFIG_FILE, MARKER, STEP_DIR, latest_checkpoint, new_tmp_dir, step_dir_name
from .saved_config import parse_saved_job

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"


class UnusableStep(StoreError):
    """A committed remote step that cannot be resumed: damaged bytes, or a manifest naming unsafe keys."""


PARTS_DIR = ".parts"
_DOWNLOAD_WORKERS = 8


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def step_prefix(store: ObjectStore, step: int) -> str:
    return store.dir_key(step_dir_name(step))


def remote_steps(store: ObjectStore) -> list[int]:
    """Every step with objects under the store's prefix (committed or not), oldest first."""
    names = store.list_dirs(store.dir_key())
    return sorted(int(m.group(1)) for name in names if (m := STEP_DIR.match(name)))


def read_manifest(store: ObjectStore, step: int) -> dict[str, Any] | None:
    """The manifest of ``step``, or None when the step is not committed."""
    body = store.get(step_prefix(store, step) + MANIFEST)
    return json.loads(body) if body is not None else None


def committed_step(remote: str) -> int | None:
    """The newest step committed to ``remote``, or None."""
    found = newest_committed(open_store(remote))
    return found[0] if found is not None else None


def newest_committed(store: ObjectStore) -> tuple[int, dict[str, Any]] | None:
    for step in reversed(remote_steps(store)):
        manifest = read_manifest(store, step)
        if manifest is not None:
            return step, manifest
    return None


def download_step(store: ObjectStore, step: int, manifest: dict[str, Any], root: Path) -> Path | None:
    """Copy committed ``step`` into ``root`` (checked against its manifest); the local path, or None if taken.

    Downloads into a ``.tmp-`` directory (start-up deletes it if this is
    interrupted) and renames it into place; when another node sharing the
    directory got there first, its copy stays and this one is dropped.
    """
    final = root / step_dir_name(step)
    tmp = new_tmp_dir(final)
    prefix = step_prefix(store, step)
    targets = manifest_targets(store, step, manifest, tmp)

    def fetch(entry: dict[str, Any]) -> None:
        target = targets[entry["key"]]
        target.parent.mkdir(parents=True, exist_ok=True)
        store.download(prefix + entry["key"], target)
        size = target.stat().st_size
        if size != entry["size"] or sha256(target) != entry["sha256"]:
            raise UnusableStep(
                f"{store.where(prefix + entry['key'])}: {size} bytes whose SHA-256 does not match the manifest "
                f"({entry['size']} bytes): the remote copy of step {step} is damaged"
            )

    tmp.mkdir(parents=True)
    try:
        with ThreadPoolExecutor(_DOWNLOAD_WORKERS) as pool:
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


def manifest_targets(store: ObjectStore, step: int, manifest: dict[str, Any], tmp: Path) -> dict[str, Path]:
    """Each manifest key's path under ``tmp``; StoreError, before anything is written, for a key that leaves it.

    The manifest is read from the bucket, so anyone who can write there names
    the keys: ``../../x`` or ``/etc/x`` must not become a path.
    """
    targets = {}
    for entry in manifest.get("objects", []):
        key = entry.get("key") if isinstance(entry, dict) else None
        try:
            if not isinstance(key, str):
                raise UnsafeKey(f"entry {entry!r} has no key")
            targets[key] = local_path(tmp, key)
        except UnsafeKey as e:
            raise UnusableStep(
                f"{store.where(step_prefix(store, step) + MANIFEST)}: {e}: the manifest of step {step} is refused "
                "and nothing of it is downloaded"
            ) from None
    return targets


def fetch_newer(remote: str, root: Path) -> int | None:
    """Download the newest committed remote step into ``root`` when the local tier has nothing as new.

    Run by one process per node; returns the step downloaded, or None.
    """
    store = open_store(remote)
    found = newest_committed(store)
    if found is None:
        return None
    step, manifest = found
    local = latest_checkpoint(root)
    if local is not None and local[0] >= step:
        return None
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    try:
        path = download_step(store, step, manifest, root)
    except UnusableStep as e:
        if local is None:
            raise  # nothing else to resume from: a fresh start would train over the steps in S3
        # The local tier's own step is older but good: resuming from it beats a restart loop on the
        # same damaged download. The remote step stays for an admin to look at (nothing is deleted).
        log.warning("%s; resuming from the local tier's step %d instead", e, local[0])
        return None
    size = sum(o["size"] for o in manifest["objects"])
    if path is not None:
        seconds = time.perf_counter() - t0
        log.info(
            "downloaded step %d from %s (%.1f MB in %.1f s): newer than the local tier (%s)",
            step,
            store,
            size / 1e6,
            seconds,
            f"step {local[0]}" if local else "empty",
        )
    return step


def owner_problem(store: ObjectStore, job: JobInfo) -> str | None:
    """Why ``job`` may not use the store's prefix: its newest committed step is another training's (None: it may).

    Asked before anything under the prefix is deleted or downloaded: the other
    training's uploads in flight look uncommitted, and its steps would be
    resumed and pruned as this one's (the local tier's rule, ``ownership.py``).
    """
    found = newest_committed(store)
    if found is None:
        return None
    step = found[0]
    body = store.get(step_prefix(store, step) + CONFIG_FILE)
    if body is None:
        return None  # a step without its config makes no claim either way
    owner = parse_saved_job(body.decode(errors="replace"))
    if owner is None:
        return None
    if (owner.namespace, owner.name) == (job.namespace, job.name):
        return None
    return (
        f"{store} holds the checkpoints of training {owner.namespace}/{owner.name} (newest committed step {step}); "
        f"this is {job.namespace}/{job.name}. Two trainings on one prefix resume from and prune each other's "
        "steps: give each its own checkpoint.remote"
    )


def prefix_taken(remote: str, job: JobInfo) -> str | None:
    """The config check's ``owner_problem``: one line before torchrun; None when it cannot ask (rank 0 asks again)."""
    try:
        return owner_problem(open_store(remote), job)
    except Exception:  # the probe has just listed and written: a hiccup here is not this check's to report
        return None


def clean_remote(remote: str, resume: str, job: JobInfo) -> str | None:
    """Rank 0 at start: delete the remote steps never committed; a problem line, or None.

    ``resume: never`` on a prefix that holds committed steps is refused: this
    run's saves would overwrite them, step by step. A prefix of another
    training's is refused before anything is deleted (``owner_problem``).
    """
    store = open_store(remote)
    problem = owner_problem(store, job)
    if problem is not None:
        return problem
    steps = remote_steps(store)
    committed = [step for step in steps if read_manifest(store, step) is not None]
    if resume == "never" and committed:
        return (
            f"{store} already holds committed checkpoints (steps {', '.join(map(str, committed))}) and "
            "checkpoint.resume is never: this run would overwrite them; use another prefix, or delete them first"
        )
    for step in steps:
        if step not in committed:
            delete_prefix(store, step_prefix(store, step))
            log.warning("removed uncommitted remote checkpoint %s/%s", store, step_dir_name(step))
    return None


def probe(remote: str) -> tuple[list[str], list[str]]:
    """What ``fsdp-train check`` asks of the remote tier (``ObjectStore.probe``): (errors, warnings)."""
    return open_store(remote).probe()


def _committed(uri: str) -> tuple[ObjectStore, int, dict[str, Any]]:
    """(the tier's store, the step, its manifest) of ``uri``: a tier (its newest committed step) or a step folder."""
    store = open_store(uri)
    parent, _, last = store.prefix.rpartition("/")
    named = STEP_DIR.match(last)
    if named:
        store = store.at(parent)
        step, manifest = int(named.group(1)), read_manifest(store, int(named.group(1)))
        if manifest is None:
            raise StoreError(f"{uri} is not a committed step (it has no manifest)")
        return store, step, manifest
    found = newest_committed(store)
    if found is None:
        raise StoreError(f"no committed step under {uri}")
    return store, found[0], found[1]


def committed_step_uri(uri: str) -> str:
    """``uri`` naming one committed step: itself when it names one, else its tier's newest committed step."""
    store, step, _ = _committed(uri)
    return store.where(step_prefix(store, step)).rstrip("/")


def download_committed(uri: str, root: Path) -> Path:
    """A committed step of a remote tier as a local checkpoint in ``root``, checked against its manifest.

    ``uri`` is a training's ``checkpoint.remote`` (its newest committed step) or one
    step folder under it (``.../step-00000300``); the download is the resume's own,
    and a complete copy already in ``root`` (a restart's) is used as it is. Raises
    ValueError for a malformed ``uri``, StoreError for the store's answers (a step
    that is not committed included) and OSError for the local side (a full disk).
    """
    store, step, manifest = _committed(uri)
    final = root / step_dir_name(step)
    if (final / MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    download_step(store, step, manifest, root)
    log.info("downloaded step %d of %s", step, store)
    return final
