"""``model.pretrained`` and ``data.path`` in an object store (``s3://``): copied into a local cache, read locally.

The cache lives under ``$HF_HOME/<scheme>`` (``$HF_HOME/s3``; the pod mounts
HF_HOME writable, as for hub snapshots), keyed by bucket and key. An object already there with the
same size and ETag is not fetched again, so the config check fetches once per
pod and the ranks after it find everything in place; a lock per location keeps
the ranks of one node from fetching the same files at once. What the trainer
then reads is a local directory or file, with the checks the hub and local
paths get (config.json, safetensors per shard slice, the data formats).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fsdp_api.object_keys import UnsafeKey, local_path
from fsdp_api.trainer_config import TrainerConfig

from .errors import ConfigError
from .storage import ObjectInfo, ObjectStore, StoreError, is_remote, open_store

log = logging.getLogger(__name__)

# Weight formats the trainer never reads (it loads safetensors only): not fetched.
SKIPPED_SUFFIXES = (".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".onnx", ".gguf")
_ETAGS = ".s3-etags.json"


def cache_root(scheme: str = "s3") -> Path:
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / scheme


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    # Beside the directory, not in it: a data directory is read whole.
    with open(directory.with_name(directory.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _objects(store: ObjectStore) -> tuple[bool, list[ObjectInfo]]:
    """(whether the location is one object, the objects): the key itself if it exists, else every key under it."""
    if store.prefix:
        single = store.head(store.prefix)
        if single is not None:
            return True, [single]
    return False, [o for o in store.list(store.dir_key()) if not o.key.endswith("/")]


def fetch(uri: str, field: str, *, skip: tuple[str, ...] = ()) -> Path:
    """The local copy of ``uri`` (an object, or every object under a prefix); ConfigError naming ``field``."""
    t0 = time.perf_counter()
    try:
        store = open_store(uri)
    except ValueError as e:
        raise ConfigError([f"{field}: {e}"]) from None
    try:
        single, objects = _objects(store)
    except StoreError as e:
        raise ConfigError([f"{field}: {e}"]) from None
    if not objects:
        raise ConfigError([f"{field}: {store} holds no objects"])
    base = store.prefix.rsplit("/", 1)[0] if single and "/" in store.prefix else ("" if single else store.key())
    wanted = [o for o in objects if not o.key.endswith(skip or ("\0",))]
    target = cache_root(store.scheme) / store.bucket / (store.prefix or "_root")
    local_dir = target.parent if single else target
    paths = _local_paths(local_dir, base, wanted, f"{field}: {store}")
    with _locked(local_dir):
        etags_path = local_dir.with_name(local_dir.name + _ETAGS)
        etags: dict[str, str] = json.loads(etags_path.read_text()) if etags_path.is_file() else {}

        def get(o: ObjectInfo) -> int:
            rel, path = paths[o.key]
            if path.is_file() and path.stat().st_size == o.size and etags.get(rel) == o.etag:
                return 0
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            try:
                store.download(o.key, partial)
            except StoreError as e:
                raise ConfigError([f"{field}: {e}"]) from None
            partial.rename(path)
            etags[rel] = o.etag
            return o.size

        with ThreadPoolExecutor(8) as pool:
            fetched = sum(pool.map(get, wanted))
        etags_path.write_text(json.dumps(etags))
    if fetched:
        log.info("%s: fetched %.1f MB from %s in %.1f s", field, fetched / 1e6, store, time.perf_counter() - t0)
    return local_dir / Path(store.prefix).name if single else local_dir


def _local_paths(local_dir: Path, base: str, objects: list[ObjectInfo], where: str) -> dict[str, tuple[str, Path]]:
    """Each object's (key below ``base``, local path); ConfigError, before any download, for a key leaving the dir.

    Keys are stored verbatim, so a writer of the bucket can list ``a/../../x``.
    """
    paths = {}
    for o in objects:
        rel = o.key[len(base) :].removeprefix("/") if base else o.key
        try:
            paths[o.key] = (rel, local_path(local_dir, rel))
        except UnsafeKey as e:
            raise ConfigError([f"{where}: object {o.key!r} refused, nothing fetched: {e}"]) from None
    return paths


def localize(cfg: TrainerConfig) -> TrainerConfig:
    """``cfg`` with its object-store inputs replaced by their local copies (fetched now, or found in the cache)."""
    updates: dict[str, Any] = {}
    if is_remote(cfg.model.pretrained):
        local = fetch(cfg.model.pretrained, "model.pretrained", skip=SKIPPED_SUFFIXES)
        updates["model"] = cfg.model.model_copy(update={"pretrained": str(local)})
    if is_remote(cfg.data.path):
        local = fetch(cfg.data.path, "data.path")
        updates["data"] = cfg.data.model_copy(update={"path": str(local)})
    return cfg.model_copy(update=updates) if updates else cfg
