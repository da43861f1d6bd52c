"""``model.pretrained`` and ``data.path`` on S3: copied into a local cache, then read as local paths.

The cache lives under ``$HF_HOME/s3`` (the pod mounts HF_HOME writable, as
for hub snapshots), keyed by bucket and key. An object already there with the
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
from .s3 import S3Error, S3Location, client, describe

log = logging.getLogger(__name__)

SCHEME = "s3://"
# Weight formats the trainer never reads (it loads safetensors only): not fetched.
SKIPPED_SUFFIXES = (".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".onnx", ".gguf")
_ETAGS = ".s3-etags.json"


def is_s3(ref: str | None) -> bool:
    return bool(ref) and ref.startswith(SCHEME)  # type: ignore[union-attr]


def cache_root() -> Path:
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "s3"


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


def _objects(s3: Any, loc: S3Location) -> tuple[bool, list[dict[str, Any]]]:
    """(whether ``loc`` is one object, the objects): the key itself if it exists, else every key under it."""
    from botocore.exceptions import ClientError

    if loc.prefix:
        try:
            head = s3.head_object(Bucket=loc.bucket, Key=loc.prefix)
            return True, [{"Key": loc.prefix, "Size": head["ContentLength"], "ETag": head["ETag"]}]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
    prefix = loc.key() + "/" if loc.prefix else ""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=prefix):
        found += [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return False, found


def fetch(uri: str, field: str, *, skip: tuple[str, ...] = ()) -> Path:
    """The local copy of ``uri`` (an object, or every object under a prefix); ConfigError naming ``field``."""
    t0 = time.perf_counter()
    try:
        loc = S3Location.parse(uri)
    except ValueError as e:
        raise ConfigError([f"{field}: {e}"]) from None
    try:
        s3 = client()
        single, objects = _objects(s3, loc)
    except S3Error as e:
        raise ConfigError([f"{field}: {e}"]) from None
    except Exception as e:
        raise ConfigError([f"{field}: {describe(e, str(loc), 'ListObjectsV2')}"]) from None
    if not objects:
        raise ConfigError([f"{field}: {loc} holds no objects"])
    base = loc.prefix.rsplit("/", 1)[0] if single and "/" in loc.prefix else ("" if single else loc.key())
    wanted = [o for o in objects if not o["Key"].endswith(skip or ("\0",))]
    target = cache_root() / loc.bucket / (loc.prefix or "_root")
    local_dir = target.parent if single else target
    paths = _local_paths(local_dir, base, wanted, f"{field}: {loc}")
    with _locked(local_dir):
        etags_path = local_dir.with_name(local_dir.name + _ETAGS)
        etags: dict[str, str] = json.loads(etags_path.read_text()) if etags_path.is_file() else {}

        def get(o: dict[str, Any]) -> int:
            rel, path = paths[o["Key"]]
            if path.is_file() and path.stat().st_size == o["Size"] and etags.get(rel) == o["ETag"]:
                return 0
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            try:
                s3.download_file(loc.bucket, o["Key"], str(partial))
            except Exception as e:
                where = f"s3://{loc.bucket}/{o['Key']}"
                raise ConfigError([f"{field}: {describe(e, where, 'GetObject')}"]) from None
            partial.rename(path)
            etags[rel] = o["ETag"]
            return int(o["Size"])

        with ThreadPoolExecutor(8) as pool:
            fetched = sum(pool.map(get, wanted))
        etags_path.write_text(json.dumps(etags))
    if fetched:
        log.info("%s: fetched %.1f MB from %s in %.1f s", field, fetched / 1e6, loc, time.perf_counter() - t0)
    return local_dir / Path(loc.prefix).name if single else local_dir


def _local_paths(local_dir: Path, base: str, objects: list[dict[str, Any]], where: str) -> dict[str, tuple[str, Path]]:
    """Each object's (key below ``base``, local path); ConfigError, before any download, for a key leaving the dir.

    Keys are stored verbatim, so a writer of the bucket can list ``a/../../x``.
    """
    paths = {}
    for o in objects:
        rel = o["Key"][len(base) :].removeprefix("/") if base else o["Key"]
        try:
            paths[o["Key"]] = (rel, local_path(local_dir, rel))
        except UnsafeKey as e:
            raise ConfigError([f"{where}: object {o['Key']!r} refused, nothing fetched: {e}"]) from None
    return paths


def localize(cfg: TrainerConfig) -> TrainerConfig:
    """``cfg`` with its S3 inputs replaced by their local copies (fetched now, or found in the cache)."""
    updates: dict[str, Any] = {}
    if is_s3(cfg.model.pretrained):
        local = fetch(cfg.model.pretrained, "model.pretrained", skip=SKIPPED_SUFFIXES)  # type: ignore[arg-type]
        updates["model"] = cfg.model.model_copy(update={"pretrained": str(local)})
    if is_s3(cfg.data.path):
        local = fetch(cfg.data.path, "data.path")  # type: ignore[arg-type]
        updates["data"] = cfg.data.model_copy(update={"path": str(local)})
    return cfg.model_copy(update=updates) if updates else cfg
