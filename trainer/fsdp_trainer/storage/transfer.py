"""Whole-prefix work on any store: upload a directory, delete a prefix."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .base import ObjectStore, StoreError

_WORKERS = 8


def upload_tree(local: Path, store: ObjectStore) -> int:
    """Upload every file under ``local`` to ``store`` (its relative paths as keys); the bytes sent.

    Refuses (StoreError) when the location already holds objects: an upload never overwrites.
    """
    prefix = store.dir_key()
    if store.list(prefix, limit=1):
        raise StoreError(f"{store} already holds objects; an upload never overwrites: give a new prefix")
    files = sorted(p for p in local.rglob("*") if p.is_file())

    def put(path: Path) -> int:
        store.upload(path, prefix + path.relative_to(local).as_posix())
        return path.stat().st_size

    with ThreadPoolExecutor(_WORKERS) as pool:
        return sum(pool.map(put, files))


def delete_prefix(store: ObjectStore, prefix: str, first: str | None = None) -> int:
    """Delete every object under ``prefix`` (``first``, a key, before the rest); the count deleted."""
    if first is not None:
        store.delete([first])
    keys = [o.key for o in store.list(prefix)]
    store.delete(keys)
    return len(keys) + (first is not None)
